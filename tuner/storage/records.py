"""What the study storage holds, as Pydantic models: the contract between the search and the report.

Every trial's knobs, launch result, load runs (the knee curve), capacity, diagnosis and engine metrics at
the knee are stored as Optuna trial user attributes (JSON of these models); the study's own attributes
hold the workload, SLO and engine. `tune report RUN_DIR` rebuilds everything from that storage alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from tuner.knobs import Knobs
from tuner.failures import LaunchFacts
from tuner.metrics.window import GaugeSample, LoraSample
from tuner.storage.quality import QualityResult
from tuner.settings import RunSettings

SCHEMA_VERSION = 1
#: `StudyInfo`'s: 2 holds the run's settings as one model (`tuner.settings.RunSettings`)
STUDY_SCHEMA_VERSION = 2


class ClientCheck(BaseModel):
    """Whether a load run measured the server or the client's own waiting (`tuner.replay.check`).

    Means are over every request that got a first token, on the client and in the server's histograms
    (the same population: the server's histograms are the difference of two scrapes around the run).
    """

    bound_ms: float
    #: Sends: how late the client sent its requests (sent_s - scheduled_s), p99.
    lateness_p99_ms: float | None = None
    client_ttft_mean_ms: float | None = None
    server_ttft_mean_ms: float | None = None
    client_e2e_mean_ms: float | None = None
    server_e2e_mean_ms: float | None = None
    server_queue_mean_ms: float | None = None
    #: Share of the run the client's event-loop thread spent runnable but waiting for a CPU (Linux
    #: schedstat); near 1 the client was starved by other processes.
    client_runq_share: float | None = None
    client_cpu_share: float | None = None
    #: The HTTP simulator: mean wall-clock lateness of its engine steps (its step loop behind the clock).
    sim_step_lateness_ms: float | None = None
    #: Why the run is the client's (or the simulator host's), not the server's; empty when it is the server's.
    reasons: list[str] = Field(default_factory=list)

    @property
    def client_bound(self) -> bool:
        return bool(self.reasons)

    def line(self) -> str:
        """The figures, one line: 'client mean TTFT 510 ms vs the server's 12 ms; sends p99 620 ms late'."""
        parts = []
        if self.client_ttft_mean_ms is not None and self.server_ttft_mean_ms is not None:
            parts.append(f"client mean TTFT {self.client_ttft_mean_ms:.0f} ms vs the server's own "
                         f"{self.server_ttft_mean_ms:.0f} ms")
        if self.client_e2e_mean_ms is not None and self.server_e2e_mean_ms is not None:
            parts.append(f"mean E2E {self.client_e2e_mean_ms:.0f} vs {self.server_e2e_mean_ms:.0f} ms")
        if self.lateness_p99_ms is not None:
            parts.append(f"sends p99 {self.lateness_p99_ms:.0f} ms late")
        if self.client_runq_share is not None:
            parts.append(f"client waited for a CPU {100 * self.client_runq_share:.0f}% of the run")
        if self.sim_step_lateness_ms is not None:
            parts.append(f"simulator steps {self.sim_step_lateness_ms:.1f} ms late on average")
        return "; ".join(parts)


class LoadRunSummary(BaseModel):
    """One load run at one offered rate: a point of the knee curve."""

    rate: float                       # the rate asked for (the schedule's nominal rate)
    offered_rps: float | None = None  # the rate actually sent in the scored window (realised)
    served_rps: float | None = None   # offered minus the growth of the in-flight count, at most offered
    #: The same figure unclamped (the twin's fit compares it with the simulator's; it reads above offered
    #: when requests were cut or dropped, since an error also ends a request).
    departure_rps: float | None = None
    verdict: str = ""                 # meets | misses | errors | overloaded | too_short | inconclusive
    decided: bool = False             # the verdict's interval cleared the target (not a coin flip)
    stopped_early: bool = False       # the sequential test ended the run before its schedule did
    n: int                            # requests scored (in window)
    attainment: float
    ci_low: float
    ci_high: float
    passed: bool                      # attainment >= target (after re-measurement when inconclusive)
    goodput: float | None             # ours: good requests per second of the scored window
    goodput_bench: float | None = None  # vLLM bench serve's: good requests / the whole run's duration
    throughput_rps: float | None = None   # finished req/s (what the engine actually served)
    badness: float | None = None      # target-quantile of max(metric / threshold): 1.0 = on the SLO
    p99_ms: dict[str, float | None] = Field(default_factory=dict)   # ttft, tpot, itl, e2el
    p50_ms: dict[str, float | None] = Field(default_factory=dict)
    errors: int = 0
    errors_by_cause: dict[str, int] = Field(default_factory=dict)  # over_context, timeout, truncated, ...
    error_example: str | None = None  # the most frequent error text of the run's failed requests
    warnings: list[str] = Field(default_factory=list)              # the client's, e.g. in-flight cap hits
    binding: str | None = None        # the SLO metric violated most
    violations: dict[str, int] = Field(default_factory=dict)
    repeats: int = 1                  # load runs pooled into this point (noise-aware re-measurement)
    duration_s: float = 0.0           # engine time the run took (virtual or real)
    wall_s: float = 0.0
    #: The server's own view of the scored run beside the client's (HTTP engines; `tuner.replay.check`).
    client_check: ClientCheck | None = None
    #: Load runs at this rate measured and dropped because they were the client's, not the server's
    #: (their checks, for the report and the run line).
    client_bound_runs: list[ClientCheck] = Field(default_factory=list)
    #: LoRA workloads: p99 TTFT (ms), attainment and requests of the hot and cold deciles of adapters (by
    #: the workload's own request counts; `tuner.lora.popularity`), and the middle
    by_popularity: dict[str, dict[str, float | None]] = Field(default_factory=dict)


class MetricsDigest(BaseModel):
    """Engine metrics of one load run, condensed for the diagnosis and the report's time series."""

    samples: list[GaugeSample] = Field(default_factory=list)
    running_p90: float = 0.0
    waiting_mean: float = 0.0
    waiting_p90: float = 0.0
    waiting_trend: float = 0.0   # mean waiting in the last third of the run minus the first third
    kv_usage_p90: float = 0.0
    kv_usage_max: float = 0.0
    preemptions: float = 0.0
    prefix_hit_rate: float | None = None
    queue_time_mean_s: float | None = None
    prefill_time_mean_s: float | None = None
    max_num_seqs: int | None = None
    rate: float = 0.0
    #: speculative decoding, from vLLM's spec-decode counters (None without a speculative config):
    #: accepted / draft tokens, and the mean tokens a step yields a sequence (1 + accepted / drafts)
    spec_acceptance_rate: float | None = None
    spec_acceptance_length: float | None = None
    #: multi-LoRA, from `vllm:lora_requests_info` (None with LoRA off): distinct adapters running, and
    #: waiting without running (waiting for a slot), p90 over the run; the server's max_lora; adapters
    #: loaded into GPU slots and read from disk during the run (the simulator's counters)
    lora_running_p90: float | None = None
    lora_waiting_p90: float | None = None
    max_lora: int | None = None
    adapter_loads: float | None = None
    adapter_disk_loads: float | None = None
    #: requests waiting deferred (vLLM's `num_requests_waiting_by_reason{reason="deferred"}`), mean over the
    #: run, where the server says (real vLLM: its sign of requests waiting for an adapter slot); and the
    #: LoRA samples themselves (at most ~120), the series the report and a reader look at
    lora_deferred_mean: float | None = None
    lora_samples: list[LoraSample] = Field(default_factory=list)


DiagnosisKind = Literal["queue", "batch_cap", "kv_capacity", "prefill", "decode", "adapter_slots",
                        "launch_failure", "errors", "none"]


class Diagnosis(BaseModel):
    """The binding constraint at the knee, its evidence, and the knobs that answer it, in order."""

    kind: DiagnosisKind
    summary: str
    evidence: dict[str, float | str | None] = Field(default_factory=dict)
    knobs: list[str] = Field(default_factory=list)      # knob names, first = try first
    directions: dict[str, Literal["up", "down", "on", "off", "any"]] = Field(default_factory=dict)


class LatencyQuantiles(BaseModel):
    """Per-metric latency quantiles (ms) at the tuned capacity: the report's CDF plots."""

    q: list[float] = Field(default_factory=list)                 # quantile levels 0..1
    values_ms: dict[str, list[float]] = Field(default_factory=dict)


class LearnedConstraint(BaseModel):
    """What one failed launch taught about this host, for the rest of the study (`tuner.search.lessons`):
    `below`: the knob's values at or above `value` do not fit; `not`: the value itself cannot run here."""

    knob: str
    rule: Literal["below", "not"]
    value: float | int | str | bool | None
    #: the value worth trying next (below: what the failure's own numbers leave room for), if any
    suggest: float | int | str | bool | None = None
    #: the teaching trial ran the knob at vLLM's default: the default is ruled out too, whatever it is
    default_failed: bool = False
    trial: int
    failure: str    # the launch-failure kind
    message: str    # vLLM's words

    def text(self) -> str:
        rule = f"below {self.value}" if self.rule == "below" else f"never {self.value}"
        nxt = f"; next tried: {self.suggest}" if self.suggest is not None else ""
        return f"{self.knob} {rule} (trial {self.trial}, {self.failure}{nxt})"


class WindowCapacity(BaseModel):
    """One request window's capacity on the study's common rate grid (`tuner.capacity.windows`)."""

    seed: int                          # the window: its request sample and arrival pattern
    capacity_rps: float | None = None  # the highest grid rate that passed (None: none did)
    runs: int = 0                      # load runs it took
    bracketed: bool = True             # the next grid rate was measured and failed


class TrialRecord(BaseModel):
    """Everything one trial did. Stored as the Optuna user attribute `record`."""

    schema_version: int = SCHEMA_VERSION
    number: int = 0
    #: simplify: the recommendation less the knobs within noise (`tuner.search.attribute`); attribute:
    #: a leave-one-knob-out launch (`--attribute`)
    #: paired: the configuration measured on the study's common windows (`tuner.capacity.windows`), for
    #: the paired comparisons that decide the recommendation (`tuner.search.earn`)
    role: Literal["baseline", "candidate", "confirm", "grid", "tpe", "random", "gate", "simplify",
                  "attribute", "paired"] = "candidate"
    #: set knobs only; {} = vLLM's defaults. Given a `Knobs` value, stored as its `set_only()`; read back
    #: as one with `config`.
    knobs: dict = Field(default_factory=dict)
    changed_knob: str | None = None                     # the one knob this trial turned
    launched: bool = False
    launch_failure_kind: str | None = None
    launch_failure_message: str | None = None
    #: the typed facts of a failed launch's message (`tuner.failures.LaunchFacts`), what the search reads
    launch_facts: LaunchFacts | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    load_runs: list[LoadRunSummary] = Field(default_factory=list)
    capacity_rps: float | None = None                   # highest passing rate found (None: none passed)
    capacity_upper_rps: float | None = None             # lowest failing rate found
    #: the capacity's uncertainty: the highest rate that passed with its interval clear of the target,
    #: the lowest that failed clearly (None: no such point measured)
    capacity_low_rps: float | None = None
    capacity_high_rps: float | None = None
    no_capacity_reason: str | None = None               # why no rate met the SLO, one line
    raced_out: bool = False                             # failed at the incumbent's capacity: stopped early
    diagnosis: Diagnosis | None = None
    knee_metrics: MetricsDigest | None = None           # engine metrics just above the knee
    latency_at_capacity: LatencyQuantiles | None = None
    incumbent_before: float | None = None               # incumbent capacity when this trial started
    accepted: bool = False                              # became the new incumbent
    interrupted: bool = False
    #: what this trial's failed launch taught about the host (see `LearnedConstraint`)
    learned: list[LearnedConstraint] = Field(default_factory=list)
    wall_s: float = 0.0
    engine_s: float = 0.0                               # engine (GPU) seconds spent in load runs
    #: Where the trial's wall time went (`tuner.report.time_use`): waiting for the server to come up (or
    #: fail), and driving load runs (the prefix warm-up included); the rest is scoring and stopping.
    launch_s: float = 0.0
    load_wall_s: float = 0.0
    #: how far this launch's outputs moved from the baseline's (`tuner.quality`); None: not checked
    quality: QualityResult | None = None
    #: a paired trial's capacity on each of the study's common windows (its `capacity_rps` is their
    #: geometric mean, `capacity_low_rps`/`capacity_high_rps` that mean's 95% interval)
    windows: list[WindowCapacity] = Field(default_factory=list)
    #: paired: earlier launches of this configuration, interrupted, whose finished windows this trial
    #: carries (they are not measured again: a Ctrl-C repeats no finished window)
    windows_from: list[int] = Field(default_factory=list)
    #: measured ahead on another device set (`tuner.search.pool`) before the strategy asked for it: a
    #: full knee search from its predicted capacity, judged against the incumbent when asked for
    prefetched: bool = False
    #: the device set the trial ran on ('0,1'); None: the whole host (one trial at a time)
    device_set: str | None = None

    @field_validator("knobs", mode="before")
    @classmethod
    def _set_knobs(cls, v: Any) -> Any:
        return v.set_only() if isinstance(v, Knobs) else v

    @property
    def config(self) -> Knobs:
        """This trial's configuration, as the `Knobs` value it was stored from."""
        return Knobs.stored(self.knobs)


class StudyInfo(BaseModel):
    """Stored as the Optuna study user attribute `info`: the run's settings as they were given
    (`tuner.settings.RunSettings`, stored whole), and what the study found out about its inputs when it
    started. A study written before the settings were one model (schema 1, every setting a field of its
    own) is read through `_from_schema_1`."""

    schema_version: int = STUDY_SCHEMA_VERSION
    settings: RunSettings
    workload_sha256: str
    workload_requests: int
    workload_mean_prompt_tokens: float
    workload_mean_output_tokens: float
    #: how the workload's prompt text was counted (`tuner.workload.stats.WorkloadStats.token_count`)
    workload_token_count: str = ""
    slo_sha256: str
    slo: dict
    simulated: bool                                      # the engine's numbers come from a simulator
    search_space: dict = Field(default_factory=dict)     # the space as resolved (a worker needs no file)
    load: dict = Field(default_factory=dict)             # LoadSettings of every load run (for the gate)
    created_unix: float = 0.0
    tool_version: str = ""
    #: What vLLM resolves unset knobs to on this GPU (256 seqs on a 4090, 1024 on an H100), recorded when
    #: the study starts so the report says "default (256) -> 512" from storage alone (None: not known).
    vllm_defaults: dict | None = None
    #: Each request's prompt, output and cacheable-prefix tokens ({"prompt": [...], "output": [...],
    #: "cached": [...]}), recorded at the start so the plan's latency floors read storage alone.
    workload_lengths: dict | None = None
    #: The hardware a real engine ran on (`tuner.profiles.host.describe_host`); empty for the simulators.
    host: str = ""
    #: The directory `tune` ran in: the settings' input paths are as given, so a relative one is relative
    #: to it (`input_path`); "" in a study written before it was recorded.
    cwd: str = ""

    def input_path(self, path: str | Path, run_dir: str | Path | None = None) -> Path:
        """A recorded input path (the workload, the SLO) as it reads from here. A relative one was relative
        to the directory the study ran in: that directory as recorded (`cwd`), else as `run_dir` (this
        study's directory as given now) places it, when the study's `--out` was relative too (a study
        recorded before `cwd`, or a checkout that moved); else as recorded. So `tune plan --verify RUN`
        run from another directory reads the study's own workload, not a missing file."""
        p = Path(path)
        if p.is_absolute():
            return p
        roots = [Path(self.cwd)] if self.cwd else []
        out = self.settings.outputs.out
        if run_dir is not None and out is not None and not out.is_absolute() and out.parts:
            here = Path(run_dir).resolve()
            if here.parts[-len(out.parts):] == out.parts:
                roots.append(here.parents[len(out.parts) - 1])
        return next((r / p for r in roots if (r / p).exists()), p)

    @model_validator(mode="before")
    @classmethod
    def _from_schema_1(cls, raw: Any) -> Any:
        """A schema-1 `info` (each setting a field of its own) as the settings model it described."""
        if not isinstance(raw, dict) or "settings" in raw:
            return raw
        raw = dict(raw)
        old = {k: raw.pop(k) for k in list(raw) if k in _SCHEMA_1_SETTINGS}
        settings: dict[str, Any] = {"workload": old.get("workload_path"), "slo": old.get("slo_path")}
        for key, path in _SCHEMA_1_SETTINGS.items():
            if key in old and path:
                section, _, name = path.rpartition(".")
                (settings.setdefault(section, {}) if section else settings)[name] = old[key]
        if old.get("noise_floor") == old.get("precision", 0.05):
            settings.get("search", {}).pop("noise_floor", None)  # schema 1 stored the floor it resolved
        raw["settings"] = settings
        raw["schema_version"] = STUDY_SCHEMA_VERSION
        return raw


#: Schema 1's setting fields of `StudyInfo` -> their place in `RunSettings` (None: `_from_schema_1` reads it).
_SCHEMA_1_SETTINGS = {"workload_path": None, "slo_path": None, "engine": "engine.name", "gpu": "engine.gpu",
                      "model": "engine.model", "noise": "engine.noise", "time_scale": "engine.time_scale",
                      "extra_args": "engine.extra_args", "strategy": "search.strategy",
                      "noise_floor": "search.noise_floor", "precision": "knee.precision",
                      "arrival": "load.arrival", "start_rate": "load.start_rate",
                      "drop_overlong": "load.drop_overlong", "seed": "seed"}
