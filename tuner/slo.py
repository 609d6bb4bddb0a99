"""The latency SLO a configuration must meet, and the score of one load run against it.

Scoring is per request (vLLM `--goodput`, DistServe): a request is *good* when every given threshold holds for
it, and attainment is good / all requests sent in the window, failures included. That is stricter and more
honest than checking each metric's percentile separately, which lets a run pass with different requests
failing different metrics. The percentile of each threshold sets the default attainment target (p99 -> 0.99).

ITL is checked per request on the request's *largest* inter-token gap: a p99 ITL promise is about stalls a
user sees, and a request with one 2 s stall is not good even if its mean gap (TPOT) is fine. The aggregate
ITL percentiles are over all gaps pooled, as `vllm bench serve` reports them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import UserError
from tuner.inputs import parse_yaml, read_text, yaml_line
from tuner.replay.record import TOOL_CAUSES, LoadRun, RequestRecord
from tuner.limits import MAX_RATE_RPS, MAX_SECONDS
from tuner.validation import first_error

METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
Z95 = 1.959963984540054


class Threshold(BaseModel):
    """`metric <= max_ms` at `percentile` (the percentile only sets the default attainment target)."""

    model_config = ConfigDict(extra="forbid")
    max_ms: float = Field(gt=0, le=MAX_SECONDS * 1000, allow_inf_nan=False, strict=True)
    percentile: float = Field(default=99.0, gt=0, le=100, strict=True, allow_inf_nan=False)


def _normalize(data: Any) -> tuple[Any, dict[str, str]]:
    """Expand compact thresholds (`ttft_ms: 300`, `ttft: 300`) into `ttft: {max_ms: 300}`.

    Returns the expanded mapping and, for error messages, which key the user actually wrote for each
    expanded field, so an error names `ttft_ms`, not a field the user never typed.
    """
    if not isinstance(data, dict):
        return data, {}
    out, origin = dict(data), {}
    for m in METRICS:
        compact = f"{m}_ms"
        if compact in out:
            if m in out:
                raise ValueError(f"give {m} or {compact}, not both")
            out[m] = {"max_ms": out.pop(compact)}
            origin[f"{m}.max_ms"] = origin[m] = compact
        elif isinstance(out.get(m), (int, float)) and not isinstance(out.get(m), bool):
            out[m] = {"max_ms": out[m]}
            origin[f"{m}.max_ms"] = m
    return out, origin


class QualityBound(BaseModel):
    """`quality:` in the SLO: how far an output-changing configuration may move the model's answers from
    vLLM's defaults on this workload's prompts (`tuner.quality`), and how the check samples them. A
    configuration over a bound is rejected as one that breaks a latency threshold is."""

    model_config = ConfigDict(extra="forbid")
    max_kl: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False, strict=True)
    min_top1_agreement: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)
    max_accuracy_drop: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)
    #: a task file (JSONL: `prompt`, and `expected` or `regex`), relative to the SLO file
    tasks: str | None = Field(default=None, min_length=1, strict=True)
    prompts: int = Field(default=200, ge=1, le=10_000, strict=True)      # the workload's prompts sampled
    prompt_tokens: int = Field(default=256, ge=1, le=100_000, strict=True)  # each truncated to this
    answer_tokens: int = Field(default=32, ge=1, le=4096, strict=True)   # N: the greedy answer's length

    @model_validator(mode="after")
    def _drop_needs_tasks(self) -> "QualityBound":
        if self.max_accuracy_drop is not None and self.tasks is None:
            raise ValueError("max_accuracy_drop needs a task file: give quality.tasks")
        return self


class SLO(BaseModel):
    """Thresholds plus what the capacity plan needs (peak rate, headroom, price)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    description: str | None = None
    ttft: Threshold | None = None
    tpot: Threshold | None = None
    itl: Threshold | None = None
    e2el: Threshold | None = None
    # Fraction of requests that must be good. Default: the strictest threshold percentile / 100.
    # strict: a number is written as a number (`true` is not 1 and "300" is not 300)
    target: float | None = Field(default=None, gt=0, le=1, strict=True, allow_inf_nan=False)
    peak_rate: float | None = Field(default=None, gt=0, le=MAX_RATE_RPS, allow_inf_nan=False, strict=True)
    headroom: float = Field(default=0.7, gt=0, le=1, strict=True, allow_inf_nan=False)
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False, strict=True)
    quality: QualityBound | None = None

    @model_validator(mode="before")
    @classmethod
    def _compact(cls, data: Any) -> Any:
        return _normalize(data)[0]

    @model_validator(mode="after")
    def _defaults(self) -> "SLO":
        if not self.thresholds:
            raise ValueError(f"no thresholds: give at least one of {', '.join(METRICS)}")
        if self.target is None:
            self.target = max(t.percentile for t in self.thresholds.values()) / 100.0
        return self

    @property
    def thresholds(self) -> dict[str, Threshold]:
        return {m: getattr(self, m) for m in METRICS if getattr(self, m) is not None}

    @property
    def needs_token_times(self) -> bool:
        """Whether judging this SLO needs each token's time (only ITL does): an engine that keeps a list
        of times per request only for it runs faster without (`token_times` of the simulated engines)."""
        return self.itl is not None

    def describe(self) -> str:
        parts = [f"p{t.percentile:g} {m.upper()} <= {t.max_ms:g} ms" for m, t in self.thresholds.items()]
        return f"{', '.join(parts)}; target {self.target:g}"


def load_slo(path: str | Path) -> SLO:
    """Read an SLO YAML file; any mistake is a `UserError` naming the file, line and field."""
    p = Path(path)
    data, root = parse_yaml(read_text(p, "SLO file"), p)
    if data is None:
        raise UserError("empty SLO file", file=p)
    if not isinstance(data, dict):
        raise UserError(f"expected a mapping of thresholds, got {type(data).__name__}", file=p, line=1)
    try:
        _, origin = _normalize(data)
    except ValueError as e:
        raise UserError(str(e), file=p) from None
    try:
        return SLO.model_validate(data)
    except ValidationError as e:
        field, msg = first_error(e)
        if field is not None:
            line = yaml_line(root, [origin.get(field, field.split(".")[0])] +
                              ([] if field in origin else field.split(".")[1:]))
            field = origin.get(field, field)
        else:
            line = None
        if msg == "unknown field" and field and "." not in field:
            msg += f" (known: {', '.join(SLO.model_fields)}, or <metric>_ms)"
        raise UserError(msg, file=p, line=line, field=field) from None


def quality_tasks_path(slo: SLO, slo_path: str | Path) -> Path | None:
    """The SLO's task file (`quality.tasks`), relative to the SLO file's folder unless absolute."""
    if slo.quality is None or slo.quality.tasks is None:
        return None
    p = Path(slo.quality.tasks).expanduser()
    return p if p.is_absolute() else Path(slo_path).parent / p


# --- scoring ----------------------------------------------------------------------------------------------


class MetricStats(BaseModel):
    """Distribution of one metric over finished requests, in milliseconds (None when nothing finished)."""

    n: int
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None


class Score(BaseModel):
    n: int
    n_good: int
    attainment: float
    ci_low: float
    ci_high: float
    target: float
    meets_target: bool
    goodput: float | None  # good requests per second of the window
    window_s: float | None
    errors: int  # failed, truncated, timed out or unfinished: never good
    errors_by_cause: dict[str, int] = Field(default_factory=dict)  # see tuner.replay.record.ERROR_CAUSES
    error_example: str | None = None  # the most frequent error text (what the server said)
    violations: dict[str, int]  # finished requests that broke each threshold
    binding: str | None  # the threshold broken most often: the one to tune for
    metrics: dict[str, MetricStats]
    percentile_values_ms: dict[str, float | None]  # each threshold's metric at its own percentile
    warnings: list[str] = Field(default_factory=list)


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes of n: sane at 0 and at n (unlike the normal approximation),
    which is exactly where a 0.99 attainment target lives."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends: rounding must not move them off 0 and 1
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def _per_request_ms(r: RequestRecord, metric: str) -> tuple[float | None, bool]:
    """(value in ms for the per-request check, whether ITL fell back to TPOT for lack of token times)."""
    if metric == "itl":
        if r.token_times is not None:
            gaps = r.itls
            return (max(gaps) * 1000.0 if gaps else 0.0), False
        if r.output_tokens <= 1:
            return 0.0, False
        v = r.tpot
        return (v * 1000.0 if v is not None else None), True
    v = getattr(r, metric)
    return (v * 1000.0 if v is not None else None), False


def _value_ms(r: RequestRecord, metric: str) -> float | None:
    """`_per_request_ms(r, metric)[0]`, with TTFT, TPOT and E2E read off the record's fields directly (the
    same arithmetic as its properties, so the same floats): the knee search judges millions of requests."""
    s = r.sent_s
    if metric == "ttft":
        f = r.first_token_s
        return None if f is None or s is None else (f - s) * 1000.0
    if metric == "e2el":
        e = r.finish_s
        return None if e is None or s is None else (e - s) * 1000.0
    if metric == "tpot":
        f, e = r.first_token_s, r.finish_s
        if f is None or s is None or e is None:
            return None
        n = r.output_tokens
        return 0.0 if n <= 1 else ((e - s) - (f - s)) / (n - 1) * 1000.0
    return _per_request_ms(r, metric)[0]


def threshold_limits(slo: SLO) -> list[tuple[str, float]]:
    """(metric, max ms) of each threshold: the SLO read once for judging many requests (`worst_ratio`)."""
    return [(m, t.max_ms) for m, t in slo.thresholds.items()]


def _is_bad(r: RequestRecord) -> bool:
    """Failed or truncated (`not r.ok or r.truncated`): never good."""
    if r.error is not None or r.finish_s is None:
        return True
    return 0 < r.output_tokens < r.expected_output_tokens


def request_ratios(r: RequestRecord, slo: SLO) -> dict[str, float]:
    """THE per-request SLO check, one number per threshold: value / threshold (<= 1 holds). A request
    that failed, was truncated or has no value for a metric gets inf for it: it is never good. The knee
    search, the score, the gate and the report all judge requests through this function."""
    bad = _is_bad(r)
    out = {}
    for m, limit in threshold_limits(slo):
        v = None if bad else _value_ms(r, m)
        out[m] = math.inf if v is None else v / limit
    return out


def worst_ratio(r: RequestRecord, limits: list[tuple[str, float]]) -> float:
    """`max(request_ratios(r, slo).values(), default=0.0)` given `threshold_limits(slo)`, without the dict: the
    per-request check of a whole run (`tuner.capacity.verdict`) reads the SLO once, not once a request."""
    if not limits:
        return 0.0
    if _is_bad(r):
        return math.inf
    worst = None
    for m, limit in limits:
        v = _value_ms(r, m)
        x = math.inf if v is None else v / limit
        if worst is None or x > worst:
            worst = x
    return worst  # type: ignore[return-value]


def request_ratio(r: RequestRecord, slo: SLO) -> float:
    """The request's worst ratio over the thresholds (`request_ratios`); good exactly when <= 1."""
    return worst_ratio(r, threshold_limits(slo))


def worst_ratios(records: Iterable[RequestRecord], slo: SLO) -> list[float]:
    """`request_ratio` of each record (the SLO read once)."""
    limits = threshold_limits(slo)
    return [worst_ratio(r, limits) for r in records]


def is_good(r: RequestRecord, slo: SLO) -> bool:
    return request_ratio(r, slo) <= 1.0


def badness(records: Iterable[RequestRecord], slo: SLO) -> float:
    """The target-quantile of the in-window requests' worst ratios (`request_ratio`).

    Attainment >= target exactly when this is <= 1 (both come from the same per-request check), and
    unlike attainment it moves continuously with the rate, so the knee search can interpolate on it."""
    return badness_of(worst_ratios((r for r in records if r.in_window), slo), slo)


def badness_of(ratios: Iterable[float], slo: SLO) -> float:
    """`badness` of requests whose worst ratios (`worst_ratio`) are `ratios`: a caller that already holds
    them (`tuner.capacity.measure.summarize`) does not judge each request again."""
    vals = sorted(ratios)
    if not vals:
        return math.inf
    k = max(0, math.ceil(float(slo.target) * len(vals)) - 1)  # type: ignore[arg-type]
    return vals[k]


def _default_window(records: list[RequestRecord]) -> float | None:
    """Send span stretched by one mean gap (n requests occupy n gaps), so goodput = attainment x rate."""
    if len(records) < 2:
        return None
    t = [r.scheduled_s for r in records]
    span = max(t) - min(t)
    return span * len(records) / (len(records) - 1) if span > 0 else None


def score(records: Iterable[RequestRecord], slo: SLO, window: float | None = None) -> Score:
    """Score the in-window records of one load run against `slo` (per-request check)."""
    # requests the tool itself cut or never sent (a decided load run) are not the server's outcome
    recs = [r for r in records if r.in_window and r.cause not in TOOL_CAUSES]
    if window is not None and (not math.isfinite(window) or window <= 0):
        raise UserError(f"must be > 0 seconds, got {window}", field="window")
    window_s = window if window is not None else _default_window(recs)
    th = slo.thresholds
    limits = threshold_limits(slo)
    has_itl = "itl" in th
    violations = {m: 0 for m in th}
    causes: dict[str, int] = {}
    texts: dict[str, int] = {}
    n_good = errors = fallback = 0
    # a request without a cause is a complete, full-length response (`r.ok and not r.truncated`): the ones
    # the percentiles are over, each metric's value read once (`_value_ms`: the properties' arithmetic)
    finished: list[RequestRecord] = []
    values: dict[str, list[float]] = {"ttft": [], "tpot": [], "e2el": []}
    for r in recs:
        cause = r.cause
        if cause is not None:
            errors += 1
            causes[cause] = causes.get(cause, 0) + 1
            if r.error:
                texts[r.error[:300]] = texts.get(r.error[:300], 0) + 1
            continue
        finished.append(r)
        got = {}
        for m, vals in values.items():
            v = got[m] = _value_ms(r, m)
            if v is not None:
                vals.append(v)
        ratio = 0.0   # the request's worst (`request_ratio`)
        for i, (m, limit) in enumerate(limits):
            v = got[m] if m in got else _value_ms(r, m)
            x = math.inf if v is None else v / limit
            if x > 1.0:
                violations[m] += 1
            if i == 0 or x > ratio:
                ratio = x
        if has_itl:
            fallback += _per_request_ms(r, "itl")[1]
        n_good += ratio <= 1.0
    gaps = [np.diff(r.token_times) for r in finished if r.token_times and len(r.token_times) > 1]
    values["itl"] = (np.concatenate(gaps) * 1000.0).tolist() if gaps else []
    values = {m: values[m] for m in METRICS}
    metrics = {}
    for m, vals in values.items():
        if vals:
            p50, p90, p99 = np.percentile(vals, [50, 90, 99])
            metrics[m] = MetricStats(n=len(vals), mean_ms=float(np.mean(vals)), p50_ms=float(p50),
                                     p90_ms=float(p90), p99_ms=float(p99))
        else:
            metrics[m] = MetricStats(n=0)
    pct = {m: (float(np.percentile(values[m], t.percentile)) if values[m] else None) for m, t in th.items()}
    n = len(recs)
    attainment = n_good / n if n else 0.0
    lo, hi = wilson_interval(n_good, n)
    worst = max(violations.items(), key=lambda kv: kv[1], default=(None, 0))
    warnings = []
    if fallback:
        warnings.append(f"{fallback} requests had no token times: their ITL was checked on TPOT (mean gap)")
    if n == 0:
        warnings.append("no requests in the window")
    target = float(slo.target)  # type: ignore[arg-type]  # always set by the SLO validator
    return Score(n=n, n_good=n_good, attainment=attainment, ci_low=lo, ci_high=hi, target=target,
                 meets_target=n > 0 and attainment >= target,
                 goodput=(n_good / window_s) if window_s else None, window_s=window_s, errors=errors,
                 errors_by_cause=causes, error_example=max(texts, key=texts.__getitem__, default=None),
                 violations=violations, binding=worst[0] if worst[1] > 0 else None, metrics=metrics,
                 percentile_values_ms=pct, warnings=warnings)


def score_run(run: LoadRun, slo: SLO) -> Score:
    """`score` over a load run's own measured window (its records' send span when the run has none)."""
    span = run.window_end_s - run.window_start_s
    return score(run.records, slo, window=span if span > 0 else None)
