"""What failed launches teach: values this host cannot run, ruled out for the rest of the study.

Some launch failures are facts about the host, not about the configuration's other knobs, and trying the
same value again with another knob turned only burns a launch (minutes, on a real GPU):
- vLLM refuses a memory utilisation larger than the memory free at start-up ("Free memory on device
  (X/Y GiB) on startup is less than desired GPU memory utilization (U, Z GiB)", "Available memory on node
  0 ..." on CPU). That value and every higher one are out, and so is every value above the free fraction
  the message reports; that fraction, less a margin for what other processes take meanwhile, is tried
  next.
- A KV-cache dtype or quantisation whose kernel the build or the CPU lacks ("FP8 KV cache on CPU requires
  x86 with AVX-512 or AMX", "_C::static_scaled_fp8_quant() expected at most 0 argument(s)") is never
  tried again.
The numbers and knob names come from the failure's typed facts (`TrialRecord.launch_facts`, read from
vLLM's words by `tuner.engine.classify.launch_facts`), never from its text. Each lesson is stored on the
failed trial's record (`TrialRecord.learned`), so a resumed study relearns it from storage and the
report lists it; nothing is kept only in memory.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from tuner.knobs import KNOB_SPECS, Knobs, neutral_values
from tuner.storage.records import LearnedConstraint, TrialRecord

#: Taken off the free fraction vLLM reported: other processes' memory moves between two launches.
FREE_MARGIN = 0.02
_HOST_FAILURES = ("unsupported", "bad_flag")
#: The knobs a host or build may lack a value's kernel for (`KnobSpec.host_dependent`); which of them a
#: failure names is the engine's reading of its message (`LaunchFacts.named_knobs`).
_HOST_KNOBS = tuple(s.name for s in KNOB_SPECS.values() if s.host_dependent)


def _memory_lesson(rec: TrialRecord, defaults: dict[str, Any]) -> LearnedConstraint | None:
    msg = rec.launch_failure_message or ""
    tried = rec.knobs.get("gpu_memory_utilization")
    suggest = None
    facts = rec.launch_facts
    if facts and facts.free_gib is not None and facts.total_gib is not None and facts.asked_utilization is not None:
        free, total, asked = facts.free_gib, facts.total_gib, facts.asked_utilization
        tried = asked  # vLLM's word for the value it resolved, the default included
        if total > 0:
            # nothing above the free fraction fits either; less a margin, that fraction is tried next
            tried = min(asked, math.floor(free / total * 1000) / 1000)
            fits = math.floor((free / total - FREE_MARGIN) * 100) / 100
            suggest = fits if 0.05 <= fits < tried else None
    if tried is None:
        tried = defaults.get("gpu_memory_utilization")
    if tried is None:
        return None
    return LearnedConstraint(knob="gpu_memory_utilization", rule="below", value=tried, suggest=suggest,
                             default_failed="gpu_memory_utilization" not in rec.knobs, trial=rec.number,
                             failure=rec.launch_failure_kind or "", message=msg[:300])


def _host_lesson(rec: TrialRecord) -> LearnedConstraint | None:
    """A dtype or quantisation the host cannot run: the knob the message names, else the one knob the
    trial turned, else the only one of them set."""
    msg = rec.launch_failure_message or ""
    if msg.startswith("breaks constraint"):
        return None  # the space's own rule, not a fact about the host
    neutral = neutral_values()
    set_here = [k for k in _HOST_KNOBS if rec.knobs.get(k) is not None and rec.knobs.get(k) != neutral.get(k)]
    named = [k for k in (rec.launch_facts.named_knobs if rec.launch_facts else []) if k in set_here]
    if named:
        knob = named[0]
    elif rec.changed_knob in set_here:
        knob = rec.changed_knob
    elif len(set_here) == 1:
        knob = set_here[0]
    else:
        return None
    return LearnedConstraint(knob=knob, rule="not", value=rec.knobs[knob], trial=rec.number,
                             failure=rec.launch_failure_kind or "", message=msg[:300])


def learn(rec: TrialRecord, defaults: dict[str, Any]) -> list[LearnedConstraint]:
    """The lessons of one failed launch (none for a failure that says nothing about the host)."""
    kind = rec.launch_failure_kind
    out: list[LearnedConstraint | None] = []
    if kind == "memory_utilization":
        out.append(_memory_lesson(rec, defaults))
    elif kind == "oom" and rec.changed_knob == "gpu_memory_utilization":
        out.append(_memory_lesson(rec, defaults))
    elif kind in _HOST_FAILURES:
        out.append(_host_lesson(rec))
    return [x for x in out if x is not None]


class Lessons:
    """The constraints learned so far, and what they allow."""

    def __init__(self, learned: Iterable[LearnedConstraint] = ()):
        self.items: list[LearnedConstraint] = list(learned)

    @classmethod
    def from_records(cls, records: Iterable[TrialRecord]) -> "Lessons":
        return cls(c for r in sorted(records, key=lambda r: r.number) for c in r.learned)

    def __bool__(self) -> bool:
        return bool(self.items)

    def _value(self, knobs: Knobs, knob: str, defaults: dict[str, Any]) -> Any:
        v = getattr(knobs, knob)
        return defaults.get(knob) if v is None else v

    def broken_by(self, knobs: Knobs, defaults: dict[str, Any]) -> LearnedConstraint | None:
        """The first lesson that rules `knobs` out, or None."""
        for c in self.items:
            unset = getattr(knobs, c.knob) is None
            v = self._value(knobs, c.knob, defaults)
            if c.rule == "below":
                if (unset and c.default_failed) or (v is not None and v >= c.value):
                    return c
            elif (unset and c.default_failed) or (v is not None and v == c.value):
                return c
        return None

    def suggestion(self, knob: str, knobs: Knobs, defaults: dict[str, Any]) -> Any:
        """The newest suggested value of `knob` that no lesson rules out, with `knobs`' other values."""
        for c in reversed(self.items):
            if c.knob == knob and c.suggest is not None and \
                    self.broken_by(knobs.with_(**{knob: c.suggest}), defaults) is None:
                return c.suggest
        return None

    def repair(self, knobs: Knobs, defaults: dict[str, Any]) -> Knobs:
        """`knobs` with each ruled-out value replaced by what the lessons allow: the suggested memory
        utilisation, or vLLM's default dtype/quantisation. Unchanged where nothing allowed is known."""
        for _ in range(len(self.items)):
            c = self.broken_by(knobs, defaults)
            if c is None:
                break
            if c.rule == "below" and self.suggestion(c.knob, knobs, defaults) is not None:
                knobs = knobs.with_(**{c.knob: self.suggestion(c.knob, knobs, defaults)})
            elif c.rule == "not" and getattr(knobs, c.knob) is not None and not c.default_failed:
                knobs = knobs.with_(**{c.knob: None})
            else:
                break
        return knobs

    def allowed(self, knob: str, values: Iterable[Any], knobs: Knobs, defaults: dict[str, Any]) -> list[Any]:
        """`values` of one knob the lessons still allow with `knobs`' other values, the suggested one
        first."""
        ok = [v for v in values if self.broken_by(knobs.with_(**{knob: v}), defaults) is None]
        s = self.suggestion(knob, knobs, defaults)
        return ([s] if s is not None else []) + [v for v in ok if v != s]
