"""The report's quality evidence (`tuner.quality`): a cell per trial, the section of every checked launch
with the noise floor, and the sentence about the recommended configuration. Simulated divergences (the
HTTP simulator's stated stand-in) are always labelled SIMULATED; a launch without evidence says why."""

from __future__ import annotations

from typing import Iterable

from tuner.knobs import KNOB_SPECS
from tuner.storage.quality import QualityResult

OUTPUT_KNOB_NAMES = ", ".join(k for k, s in KNOB_SPECS.items() if s.changes_outputs)


def changing(knobs: dict) -> dict:
    """The output-changing knobs `knobs` sets (to other than their neutral value)."""
    return {k: v for k, v in knobs.items()
            if k in KNOB_SPECS and KNOB_SPECS[k].changes_outputs and v not in (None, KNOB_SPECS[k].neutral)}


def cell(q: QualityResult | None) -> str:
    """The trial table's quality column."""
    if q is None:
        return ""
    if q.status == "reference":
        return "reference answers"
    if q.status == "not_measured":
        return f"not measured ({q.reason})"
    text = f"KL {q.kl_mean:.3g}, top-1 {100 * (q.top1_agreement or 0):.1f}%, greedy {100 * (q.greedy_agreement or 0):.0f}%"
    if q.floor:
        text = "floor: " + text
    if q.simulated:
        text += " (SIMULATED)"
    return text + (f"; REJECTED: {q.rejected}" if q.rejected else "")


def floor_of(results: Iterable[QualityResult | None]) -> QualityResult | None:
    """The noise floor: the first measured launch of the baseline's knobs against the baseline."""
    return next((q for q in results if q is not None and q.floor and q.status == "measured"), None)


def _figures(q: QualityResult) -> str:
    return (f"KL {q.kl_mean:.3g} nats/token (p95 {q.kl_p95:.3g}), top-1 agreement "
            f"{100 * (q.top1_agreement or 0):.1f}%, identical {q.answer_tokens}-token greedy answers "
            f"{100 * (q.greedy_agreement or 0):.0f}%")


def tuned_sentence(changing: dict, q: QualityResult | None, floor: QualityResult | None) -> str:
    """What the report says of the recommended configuration's output quality, true per case."""
    if not changing:
        return (f"The recommended configuration sets no output-changing knob ({OUTPUT_KNOB_NAMES}): it "
                "answers as vLLM's defaults do, up to numerics.")
    what = ", ".join(f"{k}={v}" for k, v in changing.items())
    head = f"The recommended configuration uses {what}, which changes the model's outputs."
    if q is None:
        return head + (" Output quality was NOT measured (this study ran no quality check). Check accuracy "
                       "on your own task before deploying it.")
    if q.status != "measured":
        return head + f" Output quality was NOT measured: {q.reason}. Check accuracy on your own task before deploying it."
    fl = (f"; the noise floor (vLLM's defaults against their own second launch): {_figures(floor)}"
          if floor is not None else "; no noise floor was measured (the baseline was launched once)")
    tasks = ""
    if q.tasks is not None:
        t = q.tasks
        tasks = (f" Task check: {t.correct}/{t.items} correct against the baseline's {t.baseline_correct} "
                 f"(McNemar one-sided p={t.p_worse:.3g} that it is worse).")
    if q.simulated:
        return (head + f" SIMULATED quality, not a measurement: the HTTP simulator's stated divergence for "
                f"these knobs gives {_figures(q)}{fl}.{tasks}")
    return (head + f" Measured against vLLM's defaults on {q.prompts} of the workload's prompts "
            f"(teacher-forced top-20 log-probabilities on the defaults' own greedy answers): {_figures(q)}"
            f"{fl}.{tasks}")


def section_rows(trials: Iterable, bounded: bool = True) -> list[list[str]]:
    """The 'Output quality' table: every launch the check ran on (trials with `number`, `knobs`,
    `capacity_rps` and `quality`). `bounded`: the SLO has a `quality:` bound; without one the figures are
    shown and nothing is judged (a verdict would claim a bound nobody set)."""
    rows = [["#", "knobs", "capacity (req/s)", "KL (nats/token)", "top-1 agreement", "greedy agreement",
             "prompts", "verdict"]]
    for t in trials:
        q = t.quality
        if q is None or q.status == "reference":
            continue
        kn = " ".join(f"{k}={v}" for k, v in t.knobs.items()) or "vLLM's defaults"
        cap = f"{t.capacity_rps:.3g}" if t.capacity_rps else "n/a"
        if q.status != "measured":
            rows.append([str(t.number), kn, cap, "", "", "", "", f"not measured ({q.reason})"])
            continue
        verdict = ("noise floor (the baseline against itself)" if q.floor else
                   f"REJECTED: {q.rejected}" if q.rejected else
                   "within the bound" if bounded else "not judged (the SLO sets no quality bound)")
        if q.simulated:
            verdict += " (SIMULATED)"
        rows.append([str(t.number), kn, cap, f"{q.kl_mean:.3g}", f"{100 * (q.top1_agreement or 0):.1f}%",
                     f"{100 * (q.greedy_agreement or 0):.0f}%", str(q.prompts), verdict])
    return rows
