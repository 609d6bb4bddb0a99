"""The quality check of one study: which launches it runs on, what it measures, and the SLO's bound.

- The baseline's first launch answers a fixed sample of the workload's prompts greedily (N tokens, the
  prompt left-truncated to a stated length) and gives its top-k log-probabilities at every answer position
  (teacher forcing): the reference, stored with the study.
- Every later launch of the baseline's knobs (the confirmation the study makes anyway) is compared with it:
  the noise floor, what "the same configuration" measures here.
- Every launch that sets an output-changing knob (`KnobSpec.changes_outputs`: quantization, KV-cache dtype,
  speculative decoding) is compared with it: approximate KL, top-1 agreement, greedy-answer agreement, and
  the task check when the SLO names a task file. Prefill plus N decode steps per prompt: seconds to a
  couple of minutes per launch, against the knee search's many load runs.
- A launch over the SLO's `quality` bound is rejected (its reason recorded), before its knee search.

Simulated engines: the in-process one serves no outputs ("not measured (simulated engine)"); the HTTP
simulator serves deterministic log-probabilities whose divergence per knob is stated in its profile
(`tuner.sim.quality`), so the pipeline is exercised, and every such result is marked simulated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tuner.knobs import KNOB_SPECS
from tuner.quality.divergence import Divergence
from tuner.quality.probe import NoLogprobs, Probe, parallel
from tuner.quality.tasks import Task, mcnemar_worse
from tuner.slo import QualityBound
from tuner.storage.quality import PromptReference, QualityReference, QualityResult, TaskOutcome
from tuner.workload.model import Workload
from tuner.workload.prompts import render_prompt

TOP_K = 20            # vLLM's default --max-logprobs
P_WORSE = 0.05        # the task check calls a candidate worse below this one-sided McNemar p-value
IN_PROCESS = "simulated engine: the in-process simulator serves no model outputs"


def output_knobs(knobs: dict, defaults: dict | None = None) -> list[str]:
    """The output-changing knobs `knobs` sets to something other than vLLM's value."""
    out = []
    for k, v in knobs.items():
        spec = KNOB_SPECS.get(k)
        if spec is None or not spec.changes_outputs or v is None or v == spec.neutral:
            continue
        if defaults and defaults.get(k) == v:
            continue
        out.append(k)
    return out


def sample_prompts(workload: Workload, n: int) -> list[str]:
    """`n` prompts spread evenly over the workload (all of them when it has fewer), the same every time."""
    reqs = workload.requests
    step = max(len(reqs) / n, 1.0)
    picks = sorted({int(i * step) for i in range(min(n, len(reqs)))})
    return [render_prompt(reqs[i], i) for i in picks]


@dataclass
class QualityCheck:
    """The study's quality check; `run` is called once per launch while its server is up."""

    bound: QualityBound
    prompts: list[str]
    tasks: list[Task] = field(default_factory=list)
    simulated: bool = False
    defaults: dict = field(default_factory=dict)
    #: set once the server could not answer (an old vLLM, --max-logprobs too low): said once, then every
    #: later launch is marked not measured with the same reason instead of asking again
    unavailable: str | None = None
    say: Callable[[str], Any] | None = None

    def changed(self, knobs: dict) -> list[str]:
        return output_knobs(knobs, self.defaults)

    def wanted(self, knobs: dict, reference: QualityReference | None) -> str | None:
        """'reference', 'floor', 'compare', or None (this launch changes no output)."""
        if output_knobs(knobs, self.defaults):
            return "compare"
        if reference is None:
            return "reference"
        return "floor" if knobs == reference.knobs else None

    def run(self, server: Any, knobs: dict, trial: int, reference: QualityReference | None,
            save: Callable[[QualityReference], None]) -> QualityResult | None:
        """This launch's quality evidence (None: nothing to check); a new reference goes to `save`."""
        what = self.wanted(knobs, reference)
        if what is None:
            return None
        base_url = server.info.base_url
        if self.unavailable is not None or base_url is None:
            if what == "reference":
                return None
            return QualityResult(status="not_measured", reason=self.unavailable or IN_PROCESS,
                                 simulated=self.simulated)
        probe = Probe(base_url=base_url, model=server.model, headers=server.headers, top_k=TOP_K)
        t0 = time.perf_counter()
        try:
            if what == "reference" or reference is None:
                if what != "reference":
                    return QualityResult(status="not_measured", simulated=self.simulated,
                                         reason="no reference: the baseline's launch gave no answers")
                ref = self.reference(probe, trial, knobs)
                ref.seconds = time.perf_counter() - t0
                save(ref)
                return QualityResult(status="reference", prompts=len(ref.items), answer_tokens=ref.answer_tokens,
                                     simulated=self.simulated, seconds=ref.seconds, reference_trial=trial)
            res = self.compare(probe, reference, floor=what == "floor")
        except NoLogprobs as e:
            self.unavailable = f"the server gave no prompt logprobs: {e}"
            if self.say:
                self.say(f"quality not measured: {self.unavailable}; the study goes on without it")
            return None if what == "reference" else QualityResult(
                status="not_measured", reason=self.unavailable, simulated=self.simulated)
        res.seconds = time.perf_counter() - t0
        res.rejected = self.breaks(res)
        return res

    def reference(self, probe: Probe, trial: int, knobs: dict) -> QualityReference:
        b = self.bound
        answers = parallel(lambda c, p: probe.answer(c, p, b.answer_tokens, b.prompt_tokens), self.prompts)
        forced = parallel(lambda c, a: probe.forced(c, a[0], a[1]), answers)
        items = [PromptReference(prompt_ids=pids, answer_ids=ids, top_ids=[list(d) for d in lps],
                                 top_logprobs=[list(d.values()) for d in lps])
                 for (pids, ids, _), lps in zip(answers, forced)]
        correct = self.task_answers(probe)
        return QualityReference(trial=trial, knobs=dict(knobs), top_k=probe.top_k, prompt_tokens=b.prompt_tokens,
                                answer_tokens=b.answer_tokens, simulated=self.simulated, items=items,
                                task_correct=correct)

    def task_answers(self, probe: Probe) -> list[bool]:
        return parallel(lambda c, t: t.correct(probe.text_answer(c, t.prompt, t.max_tokens)), self.tasks)

    def compare(self, probe: Probe, ref: QualityReference, *, floor: bool) -> QualityResult:
        div = Divergence()
        items = ref.items
        forced = parallel(lambda c, it: probe.forced(c, it.prompt_ids, it.answer_ids), items)
        greedy = parallel(lambda c, it: probe.answer(c, it.prompt_ids, ref.answer_tokens)[1], items)
        for it, cand, ans in zip(items, forced, greedy):
            base = [dict(zip(ids, lps)) for ids, lps in zip(it.top_ids, it.top_logprobs)]
            div.add_positions(base, cand)
            div.add_answer(it.answer_ids, ans)
        if not div.kls:  # every reference answer was empty: nothing to compare at
            return QualityResult(status="not_measured", reason="the reference answers are empty",
                                 simulated=self.simulated or ref.simulated, reference_trial=ref.trial)
        tasks = None
        if self.tasks and len(ref.task_correct) == len(self.tasks):
            tasks = task_outcome(ref.task_correct, self.task_answers(probe))
        return QualityResult(status="measured", floor=floor, reference_trial=ref.trial, prompts=len(items),
                             answer_tokens=ref.answer_tokens, simulated=self.simulated or ref.simulated,
                             tasks=tasks, **div.summary())

    def breaks(self, r: QualityResult) -> str | None:
        """The SLO's quality bound `r` breaks, in words; None within it (the floor is never judged)."""
        b = self.bound
        if r.floor or r.status != "measured":
            return None
        if b.max_kl is not None and r.kl_mean is not None and r.kl_mean > b.max_kl:
            return f"KL {r.kl_mean:.3g} > max_kl {b.max_kl:g}"
        if b.min_top1_agreement is not None and r.top1_agreement is not None \
                and r.top1_agreement < b.min_top1_agreement:
            return f"top-1 agreement {r.top1_agreement:.3f} < min_top1_agreement {b.min_top1_agreement:g}"
        t = r.tasks
        if b.max_accuracy_drop is not None and t is not None and t.accuracy_drop > b.max_accuracy_drop \
                and t.p_worse < P_WORSE:
            return (f"task accuracy dropped {t.accuracy_drop:.1%} > max_accuracy_drop {b.max_accuracy_drop:g} "
                    f"(McNemar p={t.p_worse:.3g}, {t.only_baseline} vs {t.only_here} discordant)")
        return None


def task_outcome(base: list[bool], here: list[bool]) -> TaskOutcome:
    b = sum(x and not y for x, y in zip(base, here))
    c = sum(y and not x for x, y in zip(base, here))
    n = len(base)
    return TaskOutcome(items=n, baseline_correct=sum(base), correct=sum(here), only_baseline=b, only_here=c,
                       p_worse=mcnemar_worse(b, c), accuracy_drop=(sum(base) - sum(here)) / n if n else 0.0)


def recheck(server: Any, ref: QualityReference, bound: QualityBound, *, simulated: bool = False) -> QualityResult:
    """The regression gate's check: `server`'s answers against a stored reference, judged by `bound`."""
    check = QualityCheck(bound=bound, prompts=[], simulated=simulated)
    if server.info.base_url is None:
        return QualityResult(status="not_measured", reason=IN_PROCESS, simulated=simulated)
    probe = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers, top_k=ref.top_k)
    t0 = time.perf_counter()
    try:
        res = check.compare(probe, ref, floor=False)
    except NoLogprobs as e:
        return QualityResult(status="not_measured", reason=f"the server gave no prompt logprobs: {e}",
                             simulated=simulated)
    res.seconds = time.perf_counter() - t0
    res.rejected = check.breaks(res)
    return res
