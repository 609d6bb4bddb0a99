"""The report as data (`report.json`): what the Markdown and HTML render, and what other tools read.

The schema is documented field by field in `docs/report-json.md`; `schema_version` changes when a field
changes meaning. Everything here is derived from the study storage, so rebuilding a report from the same
storage gives the same JSON apart from `generated_unix`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tuner.plan import Plan
from tuner.report.lora import LoraSection
from tuner.report.time_use import TimeUse
from tuner.recommend import Recommendation
from tuner.storage.shares import Simplification
from tuner.storage.select import KnobStep
from tuner.storage.quality import QualityResult
from tuner.storage.records import Diagnosis, LatencyQuantiles, LoadRunSummary, MetricsDigest
from tuner.settings import default

REPORT_SCHEMA_VERSION = 1


class ConfigSummary(BaseModel):
    """One configuration (baseline or tuned) and what was measured for it."""

    label: str
    trial: int | None = None
    knobs: dict = Field(default_factory=dict)
    serve_args: list[str] = Field(default_factory=list)
    capacity_rps: float | None = None
    capacity_upper_rps: float | None = None
    capacity_low_rps: float | None = None    # highest rate that passed with its interval clear of target
    capacity_high_rps: float | None = None   # lowest rate that failed clearly
    no_capacity_reason: str | None = None
    kv_cache_tokens: int | None = None
    knee: list[LoadRunSummary] = Field(default_factory=list)
    saturation_rps: float | None = None      # finished req/s with the whole run sent at once (if probed)
    diagnosis: Diagnosis | None = None
    knee_metrics: MetricsDigest | None = None
    latency_at_capacity: LatencyQuantiles | None = None
    quality: QualityResult | None = None     # its outputs against the baseline's (`tuner.quality`)


class HeadlineRow(BaseModel):
    metric: str
    unit: str
    baseline: float | None = None
    tuned: float | None = None
    change_pct: float | None = None
    better: str = "higher"             # which direction is an improvement: higher | lower
    at: str = "same_rate"              # same_rate: both at the comparison rate; capacity: each at its own


class Headline(BaseModel):
    """Baseline vs tuned: capacity, and the other numbers at (nearly) the same offered rate."""

    compare_rate_rps: float | None = None     # the baseline's capacity
    baseline_run_rate: float | None = None    # the load run of each config closest to it (None: none
    tuned_run_rate: float | None = None       # within 15% of it, so no same-rate comparison)
    tuned_closest_rate: float | None = None   # set when the tuned config was not measured near the rate
    capacity_gain_pct: float | None = None
    tuned_label: str = "tuned"                # what the second column is: recommended, or best measured
    rows: list[HeadlineRow] = Field(default_factory=list)


class TrialRow(BaseModel):
    number: int
    state: str
    role: str
    knobs: dict = Field(default_factory=dict)
    changed_knob: str | None = None
    launched: bool = False
    launch_failure_kind: str | None = None
    launch_failure_message: str | None = None
    capacity_rps: float | None = None
    capacity_upper_rps: float | None = None
    incumbent_before: float | None = None
    accepted: bool = False             # beat the incumbent on its own launch
    incumbent: bool | None = None      # became the incumbent (after its confirmation launch); None: unknown
    raced_out: bool = False
    load_runs: int = 0
    engine_s: float = 0.0
    diagnosis: Diagnosis | None = None
    quality: QualityResult | None = None


class WorkloadRef(BaseModel):
    path: str
    sha256: str
    requests: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    token_count: str = ""  # how prompt text was counted (the model's tokenizer.json, or an estimate)


class Report(BaseModel):
    schema_version: int = REPORT_SCHEMA_VERSION
    generated_unix: float
    tool_version: str = ""
    title: str
    simulated: bool
    engine: str
    gpu: str | None = None
    #: The hardware in words (`tuner.report.build.hardware`): the simulated GPU, or the real host.
    hardware: str | None = None
    model: str | None = None
    study_name: str
    storage: str                               # "study.db" or the storage URL of storage.txt
    strategy: str = ""
    arrival: str = Field(default_factory=lambda: default("arrival"))
    noise_floor: float = Field(default_factory=lambda: default("precision"))  # the settings' own defaults
    precision: float = Field(default_factory=lambda: default("precision"))
    workload: WorkloadRef
    slo_path: str
    slo_sha256: str
    slo: dict
    slo_text: str
    baseline: ConfigSummary
    #: the recommended configuration (`tuner.recommend`): vLLM's defaults when no gain was significant
    tuned: ConfigSummary
    #: the best measured configuration (the search's incumbent), recommended or not
    best: ConfigSummary | None = None
    recommendation: Recommendation | None = None
    #: the recommendation less the knobs whose predicted share was within noise, and its confirming launch
    simplification: Simplification | None = None
    headline: Headline
    attribution: list[KnobStep] = Field(default_factory=list)
    trials: list[TrialRow] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    engine_s: float = 0.0
    serve_command: str
    config_yaml: str
    plan: Plan | None = None
    plan_text: str | None = None
    caveats: list[str] = Field(default_factory=list)
    #: "tuned", or why the study has no result: "no_launch" (no configuration launched), "no_pass" (none
    #: met the SLO at any rate); then nothing in the report is presented as best and no gate is written
    status: str = "tuned"
    status_text: str | None = None         # the one-line reason when status is not "tuned"
    #: what failed launches taught about the host (`tuner.search.lessons`), one line each with vLLM's words
    learned: list[str] = Field(default_factory=list)
    gate_written: bool | None = None       # whether the run wrote gate.yaml (None: not known)
    twin: "TwinSection | None" = None      # `--strategy twin` only
    #: where the study's wall time went (`tuner.report.time_use`); None for a study from before it was recorded
    time_use: TimeUse | None = None
    #: LoRA workloads: each trial's hot- and cold-decile p99 TTFT and attainment (`tuner.report.lora`)
    lora: LoraSection | None = None
    #: output quality against the baseline: one line on the recommended configuration, true per case
    quality_text: str | None = None


class TwinVerified(BaseModel):
    """One configuration the twin sent to the engine: what it predicted before the launch, and what the
    launch measured."""

    trial: int
    knobs: dict
    predicted_rps: float | None
    measured_rps: float | None                  # None: raced out or no rate met the SLO
    raced_out: bool = False
    error: float | None = None                  # predicted / measured - 1
    anchored_rps: float | None = None           # the incumbent's measured capacity x the predicted ratio
    anchored_error: float | None = None         # anchored / measured - 1
    predicted_curve: list[tuple[float, float | None]] = Field(default_factory=list)   # (rate, badness)
    measured_curve: list[tuple[float, float | None]] = Field(default_factory=list)


class TwinFitRow(BaseModel):
    after_trial: int
    trials: list[int]
    loss: float
    nominal_loss: float
    params: dict
    residuals: dict[str, float]
    wall_s: float


class TwinRankRow(BaseModel):
    knobs: dict
    predicted_rps: float | None
    binding: str | None = None
    launched_trial: int | None = None
    measured_rps: float | None = None


class TwinSection(BaseModel):
    """`--strategy twin`: the fits, the whole-space ranking and the prediction error of every verified trial."""

    configurations: int = 0
    raced_out: int = 0      # of the configurations, screens that lost their race: only "below" a rate
    fits: list[TwinFitRow] = Field(default_factory=list)
    verified: list[TwinVerified] = Field(default_factory=list)
    ranking: list[TwinRankRow] = Field(default_factory=list)      # top ten of the latest ranking
    median_abs_error: float | None = None                          # over verified trials with a capacity
    median_abs_anchored_error: float | None = None                 # the same, of the anchored predictions
    stop_reason: str | None = None


Report.model_rebuild()
