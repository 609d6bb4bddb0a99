"""Which trials the report compares, and how the gain splits knob by knob.

Baseline = the trial with role "baseline" (vLLM's defaults). Tuned = the trial the runner named in the
study's `outcome` attribute, else the last trial that became the incumbent (`accepted`), because that is
the configuration the search ended on; else the best measured capacity. The gain is attributed along the chain of
accepted trials: each changed (mostly) one knob, so capacity before -> after is that knob's share.
"""

from __future__ import annotations

import math

from pydantic import BaseModel

from tuner.knobs import Knobs
from tuner.storage.reader import TrialView
from tuner.storage.records import Diagnosis, LoadRunSummary

KNOB_NAMES = tuple(Knobs.model_fields)


class KnobRow(BaseModel):
    """One knob of a step: its share of the step's gain. A one-knob step's share is the measured gain; a
    step that changed several knobs gets each knob's share predicted by the fitted twin (leave that knob
    out), labelled "predicted", and measured too where `--attribute` launched the knob's leave-one-out."""

    knob: str
    change: str                        # "max_num_seqs: default (256) -> 512"
    share_pct: float | None = None     # the share shown: measured when known, else predicted
    source: str = "measured"           # measured | predicted | unknown
    predicted_share_pct: float | None = None
    measured_share_pct: float | None = None
    within_noise: bool = False         # the share is inside the noise floor: dropped from the recommendation


class KnobStep(BaseModel):
    """One accepted step of the search: the knob(s) it turned and what that was worth."""

    trial: int
    knobs_changed: list[str]
    change: str                        # "max_num_seqs: default (256) -> 512"
    before_rps: float | None
    after_rps: float | None
    gain_rps: float | None
    gain_pct: float | None
    why: str | None = None             # the diagnosis of the incumbent that suggested this knob
    rows: list[KnobRow] = []           # one knob a row (the knob-by-knob table)


def _completed(t: TrialView) -> bool:
    return t.state == "COMPLETE" and t.record.capacity_rps is not None


def pick_configs(trials: list[TrialView], outcome: dict | None = None
                 ) -> tuple[TrialView | None, TrialView | None]:
    by_number = {t.number: t for t in trials}
    named_base = by_number.get((outcome or {}).get("baseline_trial"))
    named_tuned = by_number.get((outcome or {}).get("tuned_trial"))
    if named_tuned is not None and not _completed(named_tuned):
        named_tuned = None
    base = named_base or next((t for t in trials if t.record.role == "baseline"), None)
    if base is None:
        base = next((t for t in trials if t.number == 0), None)
    if named_tuned is not None:
        return base, named_tuned
    accepted = _chain(trials, outcome)
    if accepted:
        return base, accepted[-1]
    done = [t for t in trials if _completed(t)]
    if done:
        return base, max(done, key=lambda t: (t.record.capacity_rps, -t.number))
    return base, base


def fmt_value(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def knob_value(knobs: dict, name: str, defaults: dict | None) -> str:
    if knobs.get(name) is not None:
        return fmt_value(knobs[name])
    if defaults is None or name not in defaults:
        return "default"
    d = defaults[name]
    return f"default ({fmt_value(d) if d is not None else 'none'})"


def _chain(trials: list[TrialView], outcome: dict | None) -> list[TrialView]:
    """The trials that became the incumbent: as the strategy named them (a candidate that beat the
    incumbent once but failed its confirmation launch is not one), else every accepted trial."""
    named = (outcome or {}).get("incumbent_chain")
    if named is not None:
        by_number = {t.number: t for t in trials}
        return [by_number[n] for n in named if n in by_number and _completed(by_number[n])]
    return [t for t in trials if t.record.accepted and _completed(t)]


def _rows(changed: list[str], gain_pct: float | None, prev: dict, knobs: dict, defaults: dict | None,
          stored: dict | None, floor: float) -> list[KnobRow]:
    """One row per knob the step changed; shares of a several-knob step from the stored predictions."""
    def change(k: str) -> str:
        return f"{k}: {knob_value(prev, k, defaults)} -> {knob_value(knobs, k, defaults)}"

    if len(changed) <= 1:
        return [KnobRow(knob=k, change=change(k), share_pct=gain_pct, source="measured",
                        measured_share_pct=gain_pct, within_noise=gain_pct is not None and gain_pct <= 100 * floor)
                for k in changed]
    shares = {s["knob"]: s for s in (stored or {}).get("knobs", [])}
    rows = []
    for k in changed:
        sh = shares.get(k, {})
        pred, meas = sh.get("predicted_share_pct"), sh.get("measured_share_pct")
        shown = meas if meas is not None else pred
        rows.append(KnobRow(knob=k, change=change(k), share_pct=shown,
                            source="measured" if meas is not None else "predicted" if pred is not None else "unknown",
                            predicted_share_pct=pred, measured_share_pct=meas,
                            within_noise=bool(sh.get("within_noise"))))
    return rows


def attribution(trials: list[TrialView], base: TrialView | None, tuned: TrialView | None,
                defaults: dict | None = None, outcome: dict | None = None, shares: dict | None = None,
                floor: float = 0.05) -> list[KnobStep]:
    """Incumbent trials after the baseline, in order, up to the tuned one; each step's knobs one a row
    (`shares`: the study's stored per-knob predictions, `tuner.storage.shares`)."""
    steps_stored = {s["trial"]: s for s in (shares or {}).get("steps", [])}
    if base is None or tuned is None:
        return []
    chain = [t for t in _chain(trials, outcome) if t.number != base.number and t.number <= tuned.number
             and t.record.knobs != base.record.knobs]
    if tuned.number != base.number and tuned not in chain:
        chain.append(tuned)
    prev_knobs = dict(base.record.knobs)
    prev_cap = base.record.capacity_rps
    prev_diag: Diagnosis | None = base.record.diagnosis
    steps = []
    for t in chain:
        r = t.record
        knobs = dict(r.knobs)
        changed = [k for k in KNOB_NAMES if knobs.get(k) != prev_knobs.get(k)]
        if r.changed_knob and r.changed_knob not in changed:
            changed.insert(0, r.changed_knob)
        before = r.incumbent_before if r.incumbent_before is not None else prev_cap
        after = r.capacity_rps
        change = ", ".join(f"{k}: {knob_value(prev_knobs, k, defaults)} -> {knob_value(knobs, k, defaults)}"
                           for k in changed) or "(no knob changed: re-measured)"
        gain = after - before if after is not None and before is not None else None
        pct = (100.0 * gain / before) if gain is not None and before else None
        steps.append(KnobStep(trial=t.number, knobs_changed=changed, change=change, before_rps=before,
                              after_rps=after, gain_rps=gain, gain_pct=pct,
                              why=prev_diag.summary if prev_diag else None,
                              rows=_rows(changed, pct, prev_knobs, knobs, defaults, steps_stored.get(t.number),
                                         floor)))
        prev_knobs, prev_cap, prev_diag = knobs, after, r.diagnosis
    return steps


def closest_run(runs: list[LoadRunSummary], rate: float | None) -> LoadRunSummary | None:
    """The load run nearest `rate` (ties: the lower rate, the conservative side)."""
    if not runs or rate is None:
        return None
    return min(runs, key=lambda r: (abs(r.rate - rate), r.rate))


def sane_goodput(r: LoadRunSummary) -> LoadRunSummary:
    """Goodput can never exceed the offered rate by more than arrival noise. A point pooled from several
    repeats of the same schedule can carry one that does (good requests of all repeats over one run's
    window); it is then recomputed as attainment x offered rate, its value for a single run."""
    if r.goodput is not None and r.repeats > 1 and r.goodput > 1.2 * r.rate:
        return r.model_copy(update={"goodput": r.attainment * r.rate})
    return r


SATURATION_RPS = 1e5  # a "rate" no single instance serves: the knee search's send-everything-at-once probe


def is_probe(r: LoadRunSummary) -> bool:
    return not math.isfinite(r.rate) or r.rate >= SATURATION_RPS


def knee_curve(runs: list[LoadRunSummary]) -> list[LoadRunSummary]:
    """Load runs sorted by rate, one per rate (the last measurement of a rate wins: it pooled repeats).
    The saturation probe (the whole run sent at once) is a hint for the search, not a point of the curve."""
    by_rate: dict[float, LoadRunSummary] = {}
    for r in runs:
        if not is_probe(r):
            by_rate[r.rate] = sane_goodput(r)
    return [by_rate[k] for k in sorted(by_rate)]


def saturation_throughput(runs: list[LoadRunSummary]) -> float | None:
    """Requests per second the engine finished when everything was sent at once: its service ceiling."""
    return next((r.throughput_rps for r in runs if is_probe(r) and r.throughput_rps), None)
