"""The report's LoRA section: each trial's hot- and cold-decile p99 TTFT and attainment, and its adapter loads.

Why: under adapter thrash the SLO breaks in the long tail first, the tenants whose adapters are rarely
resident, while the pooled p99 can hide them; the capacity gain of more slots is what the headline shows,
and this table shows who it was for. Every figure is read from the trials' stored load runs (each run's
`LoadRunSummary.by_popularity`, the decile split by the workload's own request counts) and knee metrics;
nothing is estimated. A study whose workload names no adapters has no section.
"""

from __future__ import annotations

from pydantic import BaseModel

from tuner.storage.reader import TrialView
from tuner.storage.records import LoadRunSummary


class LoraRow(BaseModel):
    """One trial at one load run: its knee (the highest passing rate), or its lowest rate when none passed."""

    trial: int
    knobs: str
    rate: float
    passed: bool
    hot_p99_ttft_ms: float | None = None
    hot_attainment: float | None = None
    cold_p99_ttft_ms: float | None = None
    cold_attainment: float | None = None
    capacity_rps: float | None = None
    adapter_loads: float | None = None        # at the trial's knee metrics (just above the knee)
    adapter_disk_loads: float | None = None


class LoraSection(BaseModel):
    rows: list[LoraRow]


def _point(runs: list[LoadRunSummary]) -> LoadRunSummary | None:
    """The run that shows the trial: its highest passing rate with a decile split, else its lowest rate."""
    split = [r for r in runs if r.by_popularity]
    passed = [r for r in split if r.passed]
    if passed:
        return max(passed, key=lambda r: r.rate)
    return min(split, key=lambda r: r.rate, default=None)


def lora_section(trials: list[TrialView]) -> LoraSection | None:
    """The section's rows, one per launched trial with a decile split, in trial order (None: no LoRA)."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        rec = t.record
        p = _point(rec.load_runs)
        if p is None:
            continue
        hot, cold = p.by_popularity.get("hot") or {}, p.by_popularity.get("cold") or {}
        m = rec.knee_metrics
        rows.append(LoraRow(
            trial=t.number, knobs=", ".join(f"{k}={v}" for k, v in rec.knobs.items()) or "vLLM defaults",
            rate=p.rate, passed=p.passed, hot_p99_ttft_ms=hot.get("p99_ttft_ms"), hot_attainment=hot.get("attainment"),
            cold_p99_ttft_ms=cold.get("p99_ttft_ms"), cold_attainment=cold.get("attainment"),
            capacity_rps=rec.capacity_rps, adapter_loads=m.adapter_loads if m else None,
            adapter_disk_loads=m.adapter_disk_loads if m else None))
    return LoraSection(rows=rows) if rows else None


def _ms(x: float | None, attainment: float | None) -> str:
    if x is None:
        return "none served in time" if attainment == 0 else "n/a"
    return f"{x:,.0f} ms"


def _att(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def lora_rows(s: LoraSection) -> list[list[str]]:
    """The report's table: hot and cold deciles side by side, per trial."""
    rows = [["#", "knobs", "capacity (req/s)", "at rate", "hot decile p99 TTFT", "hot attainment",
             "cold decile p99 TTFT", "cold attainment", "adapter loads (from disk) above the knee"]]
    for r in s.rows:
        loads = "n/a" if r.adapter_loads is None else f"{r.adapter_loads:.0f} ({r.adapter_disk_loads or 0:.0f})"
        rows.append([str(r.trial), r.knobs, "none" if r.capacity_rps is None else f"{r.capacity_rps:.3g}",
                     f"{r.rate:.3g} ({'pass' if r.passed else 'fail'})", _ms(r.hot_p99_ttft_ms, r.hot_attainment),
                     _att(r.hot_attainment), _ms(r.cold_p99_ttft_ms, r.cold_attainment), _att(r.cold_attainment),
                     loads])
    return rows
