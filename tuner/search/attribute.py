"""Each knob's share of an accepted step that changed several knobs, and the simpler configuration it leaves.

The twin (and tpe/random) jump several knobs in one step, so the step's measured gain says nothing about
which knob earned it. After the search, every such step of the incumbent chain is taken apart one knob at
a time: the fitted twin predicts the step's configuration with that knob left as it was before the step
(leave one out), and the knob's share is the predicted capacity it adds, as a fraction of the predicted
capacity before the step. These are predictions and are stored and shown as such (`tuner.storage.shares`).
`--attribute` also launches each leave-one-out configuration, so every share is measured too.

A knob whose share is within the noise floor earned nothing the measurements can tell from noise: it is
dropped from the final configuration (greedily, smallest share first, while the twin predicts the
simpler configuration within noise of the whole), and that simpler configuration is launched to confirm
it. The recommendation policy (`tuner.recommend`) then prefers it for having fewer knobs if the launch
measured it within noise of the best, and keeps the measured best otherwise: a recommendation is always a
configuration that was measured, never a prediction.

This runs after the strategy has stopped, so its launches never steer the search; they are one launch
beyond `--max-trials` for the confirmation and, with `--attribute`, one per knob of each multi-knob step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tuner.knobs import Knobs
from tuner.recommend import effective_floor, launch_spreads
from tuner.search.runner import TrialRunner
from tuner.search.strategy import Budget, Outcome
from tuner.storage.records import TrialRecord
from tuner.storage.shares import ATTR, KnobShare, SharesLog, Simplification, StepShares

KNOB_NAMES = tuple(Knobs.model_fields)


def without(knobs: dict, before: dict, knob: str) -> dict:
    """`knobs` with `knob` as it was in `before` (unset there: unset here)."""
    out = dict(knobs)
    if before.get(knob) is not None:
        out[knob] = before[knob]
    else:
        out.pop(knob, None)
    return out


def changed(before: dict, after: dict) -> list[str]:
    return [k for k in KNOB_NAMES if after.get(k) != before.get(k)]


def _pct(after: float | None, without_rps: float | None, before: float | None) -> float | None:
    """A knob's share: what the step has that the step without the knob lacks, over the capacity before."""
    if not after or not before:
        return None
    return 100.0 * (after - (without_rps or 0.0)) / before


#: Several predictions at once, in order (side by side where the predictor can: `Twin.predict_many`).
PredictMany = Callable[[list[tuple[dict, float]]], list["float | None"]]


def predicted_step(predict: Callable[[dict, float], float | None], before: TrialRecord, after: TrialRecord,
                   floor: float, fit_after: int = -1, predict_many: PredictMany | None = None) -> StepShares:
    """Leave one knob out at a time, in the twin: each knob's predicted share of the step. The step's
    predictions are independent of each other and asked for together (`predict_many`)."""
    rate = after.capacity_rps or before.capacity_rps or 1.0
    knobs = changed(before.knobs, after.knobs)
    outs = [without(after.knobs, before.knobs, k) for k in knobs]
    asked = [(before.knobs, before.capacity_rps or rate), (after.knobs, rate)] + [(wk, rate) for wk in outs]
    pb, pa, *pws = predict_many(asked) if predict_many else [predict(k, r) for k, r in asked]
    step = StepShares(trial=after.number, before_trial=before.number, fit_after_trial=fit_after,
                      predicted_before_rps=pb, predicted_after_rps=pa)
    for k, wk, pw in zip(knobs, outs, pws):
        share = _pct(pa, pw, pb)
        step.knobs.append(KnobShare(knob=k, without_knobs=wk, predicted_without_rps=pw, predicted_share_pct=share,
                                    within_noise=share is not None and share <= 100 * floor))
    return step


def _measure_shares(runner: TrialRunner, step: StepShares, before: TrialRecord, after: TrialRecord,
                    floor: float) -> None:
    """`--attribute`: launch each leave-one-out configuration; a measured share replaces the prediction
    in deciding whether the knob is within noise."""
    for sh in step.knobs:
        rec = runner.evaluate(Knobs.stored(sh.without_knobs), role="attribute", changed_knob=sh.knob,
                              start_rate=after.capacity_rps, incumbent=after.capacity_rps)
        sh.measured_trial = rec.number
        sh.measured_without_rps = rec.capacity_rps if rec.launched else None
        if rec.launched:
            sh.measured_share_pct = _pct(after.capacity_rps, rec.capacity_rps, before.capacity_rps)
            sh.within_noise = sh.measured_share_pct is not None and sh.measured_share_pct <= 100 * floor


def simplify(steps: list[tuple[StepShares, TrialRecord, TrialRecord]], final: TrialRecord,
             predict: Callable[[dict, float], float | None] | None, floor: float,
             predict_many: PredictMany | None = None) -> tuple[dict, list[str], float | None]:
    """The final configuration less the knobs within noise, smallest share first, each drop kept only
    while the twin (where there is one) predicts the simpler configuration within noise of the final.
    A knob a later step set again is that step's to judge, not this one's.

    The drops are tried in a fixed order and each is usually kept, so the chain of configurations they
    lead to (every drop kept) is predicted up front, side by side (`predict_many`); a drop that is not
    kept makes the rest of the chain wrong, and those are predicted one at a time as before. The result
    is the one-at-a-time result either way."""
    rate = final.capacity_rps or 1.0
    cands = [(sh.measured_share_pct if sh.measured_share_pct is not None else sh.predicted_share_pct or 0.0,
              sh.knob, before) for step, before, after in steps for sh in step.knobs
             if sh.within_noise and final.knobs.get(sh.knob) == after.knobs.get(sh.knob)]
    order = [(k, before) for _, k, before in sorted(cands, key=lambda c: c[0])]
    ahead: dict[str, float | None] = {}
    if predict and predict_many and order:
        chain, knobs_ahead = [dict(final.knobs)], dict(final.knobs)
        for k, before in order:
            knobs_ahead = without(knobs_ahead, before.knobs, k)
            chain.append(knobs_ahead)
        ahead = {_config_key(c): p for c, p in zip(chain, predict_many([(c, rate) for c in chain]))}

    def predicted(knobs: dict) -> float | None:
        key = _config_key(knobs)
        return ahead[key] if key in ahead else predict(knobs, rate) if predict else None

    whole = predicted(final.knobs) if predict else None
    knobs, dropped, pred = dict(final.knobs), [], whole
    for k, before in order:
        trial = without(knobs, before.knobs, k)
        p = predicted(trial) if predict else None
        if predict and whole and (p is None or p * (1 + floor) < whole):
            continue  # together with the knobs already dropped, this one matters
        knobs, pred = trial, p
        dropped.append(k)
    return knobs, dropped, pred


def _config_key(knobs: dict) -> str:
    return Knobs.stored(knobs).key()


def attribute(runner: TrialRunner, budget: Budget, outcome: Outcome, *, noise_floor: float,
              predict: Callable[[dict, float], float | None] | None = None, fit_after: int = -1,
              verify: bool = False, say: Callable[[str], None] = lambda m: None,
              predict_many: PredictMany | None = None, simplify_launch: bool = True) -> SharesLog | None:
    """Shares of every multi-knob step of the incumbent chain, the simpler configuration and its
    confirming launch; stored as the study attribute `shares`. None when no step changed several knobs."""
    recs = {r.number: r for rs in runner.finished_all().values() for r in rs}
    named = outcome.chain if outcome.chain is not None else [outcome.incumbent.number]  # tpe, random, grid
    chain = [recs[n] for n in named if n in recs and recs[n].capacity_rps]
    if outcome.baseline is not None and (not chain or chain[0].number != outcome.baseline.number):
        chain.insert(0, outcome.baseline)
    floor = effective_floor(noise_floor, launch_spreads(recs.values()))
    log = SharesLog(floor=floor, verified=verify)
    steps: list[tuple[StepShares, TrialRecord, TrialRecord]] = []
    for before, after in zip(chain, chain[1:]):
        if len(changed(before.knobs, after.knobs)) < 2 or not before.capacity_rps:
            continue
        step = (predicted_step(predict, before, after, floor, fit_after, predict_many) if predict else
                StepShares(trial=after.number, before_trial=before.number,
                           knobs=[KnobShare(knob=k, without_knobs=without(after.knobs, before.knobs, k))
                                  for k in changed(before.knobs, after.knobs)]))
        if verify:
            _measure_shares(runner, step, before, after, floor)
        steps.append((step, before, after))
        log.steps.append(step)
        say(f"trial {after.number} changed {len(step.knobs)} knobs: "
            + ", ".join(f"{s.knob} {_share_text(s)}" for s in step.knobs))
    if not steps:
        return None
    if not simplify_launch:  # the paired check decides which knobs stay (`tuner.search.earn`)
        runner.study.set_user_attr(ATTR, log.model_dump(mode="json"))
        return log
    final = chain[-1]
    # the joint check costs a prediction per knob; skipped where no launch would follow (`_confirm`)
    worth = not chain[0].capacity_rps or (final.capacity_rps or 0.0) > chain[0].capacity_rps * (1 + floor)
    knobs, dropped, pred = simplify(steps, final, predict if worth else None, floor, predict_many)
    if dropped:
        log.simplification = _confirm(runner, budget, final, knobs, dropped, pred, chain[0], floor, say)
    runner.study.set_user_attr(ATTR, log.model_dump(mode="json"))
    return log


def _share_text(s: KnobShare) -> str:
    if s.measured_share_pct is not None:
        return f"{s.measured_share_pct:+.1f}% (measured)"
    return "n/a" if s.predicted_share_pct is None else f"{s.predicted_share_pct:+.1f}% (predicted)"


def _confirm(runner: TrialRunner, budget: Budget, final: TrialRecord, knobs: dict, dropped: list[str],
             pred: float | None, base: TrialRecord, floor: float, say: Callable[[str], None]) -> Simplification:
    """Launch the simpler configuration, so that the recommendation can name it; not when the final
    configuration's own gain is within noise (vLLM's defaults are recommended then, whatever the launch)."""
    out = Simplification(from_trial=final.number, dropped=dropped, knobs=knobs, predicted_rps=pred)
    names = ", ".join(dropped)
    if base.capacity_rps and (final.capacity_rps or 0.0) <= base.capacity_rps * (1 + floor):
        out.note = (f"Trial {final.number} without {names} (their shares are within the {floor:.0%} "
                    f"noise floor) was not launched: trial {final.number}'s own measured gain is within the "
                    "noise floor, so vLLM's defaults are recommended whatever the simpler configuration measures.")
        return out
    done = runner.finished().get(_key(runner, knobs))
    if done is None:
        extra = replace(budget, max_trials=runner.launches + 1)  # the confirmation is beyond --max-trials
        if not extra.left(runner):
            out.note = (f"Trial {final.number} without {names} was not launched (the time budget is spent), "
                        "so it cannot be recommended: a recommendation is always a measured configuration.")
            return out
        say(f"confirming trial {final.number} without {names} (their shares are within noise)")
        done = runner.evaluate(Knobs.stored(knobs), role="simplify", start_rate=final.capacity_rps,
                               incumbent=final.capacity_rps)
        how = f"was launched as trial {done.number} to confirm it"
    else:
        how = f"is trial {done.number}, measured before"
    out.trial = done.number
    cap = f"{done.capacity_rps:.3g} req/s" if done.capacity_rps else "no capacity"
    out.note = (f"Trial {final.number} without {names} (their predicted shares are within the {floor:.0%} "
                f"noise floor) {how}: {cap} measured against {final.capacity_rps:.3g} req/s; the "
                "recommendation takes the simpler one only if that is within the noise floor.")
    return out


def _key(runner: TrialRunner, knobs: dict) -> str:
    return runner.space.layout(Knobs.stored(knobs)).key()


def attribute_study(runner: TrialRunner, budget: Budget, outcome: Outcome, twin=None, *, noise_floor: float,
                    verify: bool = False, say: Callable[[str], None] | None = None,
                    simplify_launch: bool = True) -> SharesLog | None:
    """`attribute` with the study's fitted twin (`tuner.twin.twin.Twin`, None for strategies without
    one: then only `--attribute`'s launches give shares)."""
    predict = predict_many = None
    if twin is not None and twin.fits:
        # the twin is deterministic and its fit does not change here: a configuration predicted from the
        # same start rate is predicted once (the step's configuration and its leave-one-outs come back
        # in `simplify`)
        memo: dict[tuple[str, float], float | None] = {}

        def predict_many(asked: list[tuple[dict, float]]) -> list[float | None]:
            keyed = [((runner.space.layout(Knobs.stored(k)), rate)) for k, rate in asked]
            todo = list({(k.key(), rate): (k, rate) for k, rate in keyed if (k.key(), rate) not in memo}.items())
            for (key, _), p in zip(todo, twin.predict_many([a for _, a in todo])):
                memo[key] = p.capacity_rps
            return [memo[(k.key(), rate)] for k, rate in keyed]

        def predict(knobs: dict, rate: float) -> float | None:
            return predict_many([(knobs, rate)])[0]
    return attribute(runner, budget, outcome, noise_floor=noise_floor, predict=predict,
                     fit_after=twin.after_trial if twin is not None else -1, verify=verify,
                     say=say or (lambda m: None), predict_many=predict_many, simplify_launch=simplify_launch)
