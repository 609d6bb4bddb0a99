"""`--strategy twin`: search the whole space in the self-calibrating twin, spend real launches on verifying.

1. vLLM's defaults are launched (the baseline, as every strategy does) and the twin is fitted to that
   launch's load runs (`tuner.twin.fit`).
2. Every configuration of the space gets a predicted capacity from the knee search on the twin, in
   virtual time; they are ranked.
3. The best one not yet launched is verified on the engine: it races the incumbent at the incumbent's
   capacity, and only a survivor gets the full knee search. The twin is refitted with that launch too
   and the top of the ranking predicted again.
4. That repeats while the twin still predicts a configuration that beats the incumbent by more than the
   noise floor (the gain the incumbent's own measurement could hide); it stops once the verified best is
   within noise of the twin's best, or the budget is spent. The first verification is launched whatever
   the twin predicts: a twin fitted to the baseline alone has reproduced one configuration, and its error
   on any other is unmeasured until one is verified. On hidden-truth engines a twin fitted
   to the defaults predicted nothing beating them on 3 of 10 azure seeds and stopped at 73% of the optimum.

The twin compares configurations by their predicted ratio to the incumbent's prediction, not by absolute
numbers: a twin that is 20% optimistic everywhere still ranks them right.

A candidate carries only the knobs the twin predicts to matter (`simplest`): the top of the ranking less
each knob whose removal the twin predicts to cost less than what the recommendation asks of a knob's share
(`tuner.recommend.share_needed`). The twin's ranking tells configurations apart by fractions of a percent
that no launch can, and a jump of several knobs leaves the recommendation with knobs nobody measured to
matter (a real-engine study of SmolLM2 on 2 cores launched five at once, FP8 KV and prefix caching off among
them; the step measured +13.8% as a whole while the twin gave four of the five a share of 0.0-0.8%).
"""

from __future__ import annotations

from typing import Callable

from tuner.knobs import Knobs
from tuner.recommend import changed_knobs, removal_order, share_needed
from tuner.search.runner import TrialRunner
from tuner.search.strategies import StrategyRun, register_strategy
from tuner.search.strategies.guided import guided
from tuner.search.strategy import (Budget, Outcome, accept_floor, clearly_better_at_same_load,
                                   current_value, fitted_baseline, normalize)
from tuner.sim.lora import LoraSetup
from tuner.storage.records import TrialRecord
from tuner.storage.twin import ATTR, Prediction, TwinLog
from tuner.twin.twin import Twin


@register_strategy("twin")
def run(run: StrategyRun) -> Outcome:
    """The twin of the run's GPU and model, fitted as the study goes; the outcome carries it (the knobs'
    shares of a multi-knob step are predicted by it: `tuner.search.attribute`)."""
    s = run.settings
    twin = Twin.build(s.engine.gpu, s.engine.model, run.workload, run.slo, run.load, seed=s.seed,
                      lora=LoraSetup.from_dir(s.engine.lora_dir, s.engine.model))
    def diagnosis_leads() -> Outcome:
        return guided(run.runner, run.budget, noise_floor=s.noise_floor, plateau=s.search.plateau,
                      confirm=s.search.confirm)

    outcome = twin_search(run.runner, run.budget, twin, noise_floor=s.noise_floor, on_fit=run.say,
                          no_knee=diagnosis_leads)
    outcome.twin = None if outcome.handed_over else twin  # the shares: predicted only where it ranked
    return outcome


def _launched(runner: TrialRunner) -> list[TrialRecord]:
    """The launches the twin is fitted to. One measured ahead on another device set counts once the search
    asked for it: when a worker finishes it is a matter of timing, and the fit must not be."""
    return [r for recs in runner.finished_all().values() for r in recs
            if r.launched and r.load_runs and (not r.prefetched or runner.seen(r.config))]


def _verified(runner: TrialRunner, log: TwinLog) -> int:
    """Launched configurations the twin predicted before their launch (stored; a resumed study counts its own)."""
    return sum(1 for r in _launched(runner) if r.config.key() in log.predicted_before_launch)


def _save(runner: TrialRunner, log: TwinLog) -> None:
    runner.study.set_user_attr(ATTR, log.dump())


def twin_search(runner: TrialRunner, budget: Budget, twin: Twin, *, noise_floor: float,
                on_fit: Callable[[str], None] | None = None,
                no_knee: Callable[[], Outcome] | None = None) -> Outcome:
    """The twin's search (the module's docstring). A baseline that meets the SLO at no rate leaves the
    twin no knee to fit its SLO and capacity scales to, and a fit to it ranks the space on nothing: where
    the baseline's diagnosis names knobs that answer its binding constraint (adapter slots, the KV pool),
    `no_knee` (the diagnosis-led search) takes the study from there instead."""
    say = on_fit or (lambda msg: None)
    log = TwinLog(gpu=twin.gpu.key or twin.gpu.name, model=twin.model.name)
    stored = TwinLog.read(runner.study.user_attrs)
    if stored is not None:  # a resumed study: the predictions made before its launches stand
        log.predicted_before_launch = stored.predicted_before_launch
    base = fitted_baseline(runner, budget)
    if base.launch_failure_kind == "client_bound":
        return Outcome(base, None, f"the load client could not measure the baseline: {base.launch_failure_message}")
    if base.launch_failure_kind == "requests_failed" and not (base.diagnosis and base.diagnosis.knobs):
        return Outcome(base, None, f"the baseline failed its requests: {base.launch_failure_message}")
    if no_knee is not None and base.launched and not base.capacity_rps and base.diagnosis \
            and base.diagnosis.knobs and budget.left(runner):
        say(f"the baseline meets the SLO at no rate (binds: {base.diagnosis.kind}): no knee to fit the twin "
            f"to; the diagnosis leads ({', '.join(base.diagnosis.knobs)})")
        out = no_knee()
        out.handed_over = True
        out.stop_reason = f"{out.stop_reason} (the diagnosis led: the baseline met the SLO at no rate)"
        return out
    fitres = twin.refit(_launched(runner))
    if fitres is None:
        return Outcome(base, None, "the baseline measured no load run: nothing to fit the twin to")
    log.fits.append(fitres)
    say(f"twin fitted to trial {fitres.after_trial}: loss {fitres.loss:.3g} (nominal {fitres.nominal_loss:.3g}, "
        f"from the {fitres.start} point)")
    space = runner.space
    choices = {k: list(dict.fromkeys(space.knobs[k].values)) for k in space.knobs}  # vLLM's defaults: `extra`

    lessons = [runner.lessons()]  # read from storage again after every launch (they come from failures)

    def allowed(k: Knobs) -> bool:
        return space.allows(k, runner.defaults) is None and lessons[0].broken_by(k, runner.defaults) is None

    if not budget.left(runner):  # no launch left to verify a prediction with: ranking would be wasted
        log.stop_reason = "budget spent"
        _save(runner, log)
        if base.capacity_rps:
            runner.reporter.incumbent_changed(base)
        return Outcome(base, base if base.capacity_rps else None, "budget spent",
                       [base.number] if base.capacity_rps else [])
    start = base.capacity_rps or runner.start_rate
    ranking = twin.rank(choices, allowed, extra=[Knobs()], start_rate=start,
                        canonical=lambda k: space.layout(normalize(k, runner.defaults)))
    log.first_ranking = log.ranking = ranking
    log.configurations = len(ranking.predictions)
    log.raced_out = sum(p.below_rps is not None for p in ranking.predictions)
    say(f"twin ranked {len(ranking.predictions)} configurations in {ranking.wall_s:.1f} s"
        + (f" ({log.raced_out} raced out by a better one's capacity)" if log.raced_out else ""))
    _save(runner, log)
    return _verify(runner, budget, twin, log, ranking, base, start=start, allowed=allowed, lessons=lessons,
                   noise_floor=noise_floor, say=say)


def _verify(runner: TrialRunner, budget: Budget, twin: Twin, log: TwinLog, ranking, base: TrialRecord, *,
            start: float, allowed: Callable[[Knobs], bool], lessons: list, noise_floor: float,
            say: Callable[[str], None]) -> Outcome:
    """Steps 3 and 4 of the module's docstring: launch the best untried prediction, refit, rerank, until
    the twin predicts nothing that beats the verified best by more than the noise floor, or the budget
    is spent. `lessons[0]` is refreshed after each launch (`allowed` reads it)."""
    space = runner.space
    inc = base if base.capacity_rps else None
    chain = [base.number] if inc else []
    if inc:
        runner.reporter.incumbent_changed(inc)

    def skip(p: Prediction) -> bool:
        # evaluated by this process (a resumed study reads each stored launch back where it was made)
        k = p.config
        return runner.seen(k) or not allowed(k)

    reason = "budget spent"
    while budget.left(runner):
        ranking = twin.freshen(ranking, skip, start_rate=inc.capacity_rps if inc else start)
        cand = next((p for p in ranking.predictions if p.capacity_rps and not skip(p)), None)
        if cand is None:
            reason = "the twin predicts no configuration left to try that meets the SLO"
            break
        cand = simplest(twin, cand, lambda k: space.layout(normalize(k, runner.defaults)),
                        lambda p: skip(p) or not in_space(runner, p.config), noise_floor, runner.defaults,
                        start_rate=inc.capacity_rps if inc else start)
        knobs = cand.config
        floor = accept_floor(inc, noise_floor) if inc else None
        mine = ranking.get(normalize(inc.config, runner.defaults).set_only()) if inc else None
        if inc and mine and mine.capacity_rps:
            ratio = cand.capacity_rps / mine.capacity_rps
            if inc.capacity_rps * ratio <= floor and _verified(runner, log):
                reason = (f"the verified best is within noise of the twin's best: the twin's best untried "
                          f"predicts {ratio - 1:+.1%} over the incumbent, inside its "
                          f"{floor / inc.capacity_rps - 1:.1%} noise floor" if ratio > 1 else
                          f"the twin predicts nothing untried above the verified best: its best untried "
                          f"predicts {ratio - 1:+.1%} against the incumbent")
                break
            expect = inc.capacity_rps * ratio
            cand = cand.model_copy(update={"anchored_rps": expect})
        else:
            expect = cand.capacity_rps
        log.predicted_before_launch.setdefault(cand.key, cand)  # a resumed study keeps the first one
        _save(runner, log)
        if runner.helpers:
            _queue_ahead(runner, budget, twin, ranking, cand, skip, noise_floor,
                         lambda p: inc.capacity_rps * p.capacity_rps / mine.capacity_rps
                         if inc and mine and mine.capacity_rps else p.capacity_rps,
                         start_rate=inc.capacity_rps if inc else start)
        rec = runner.evaluate(knobs, role="candidate", incumbent=inc.capacity_rps if inc else None,
                              race_rate=inc.capacity_rps if inc else None, start_rate=expect,
                              accept_above=floor,
                              accept=(lambda r, b=inc: clearly_better_at_same_load(r, b)) if inc else None)
        lessons[0] = runner.lessons()
        if rec.accepted:
            inc = rec
            chain.append(rec.number)
            runner.reporter.incumbent_changed(rec)
        if not rec.launched:
            continue  # a launch failure: its lesson (if any) is in storage; `allowed` reads it
        fitres = twin.refit(_launched(runner))
        if fitres is not None:
            log.fits.append(fitres)
            say(f"twin refitted with trial {rec.number}: loss {fitres.loss:.3g}")
        always = [inc.config] if inc else []
        ranking = twin.rerank(ranking, always=always, start_rate=inc.capacity_rps if inc else start)
        log.ranking = ranking
        _save(runner, log)
    log.stop_reason = reason
    _save(runner, log)
    return Outcome(base, inc, reason, chain)


def _queue_ahead(runner: TrialRunner, budget: Budget, twin: Twin, ranking, cand: Prediction,
                 skip: Callable[[Prediction], bool], noise_floor: float, expect: Callable[[Prediction], float],
                 *, start_rate: float) -> None:
    """With workers on other device sets (`tuner.search.pool`): the twin's next best predictions after
    `cand`, each in the form this loop would launch it (`simplest`), queued for them, as many as there are
    free sets and launches left in the budget. A near-duplicate (one knob away from one already chosen,
    predicted within the noise floor of it) is skipped: it would tell little the other does not."""
    free = min(runner.helpers - runner.in_flight(),
               budget.max_trials - runner.launches - 1 - runner.in_flight())
    chosen: list[Prediction] = [cand]
    canonical = lambda k: runner.space.layout(normalize(k, runner.defaults))  # noqa: E731
    looked = 0
    for p in ranking.predictions:
        if len(chosen) > free or looked >= 4 * free:  # each look costs the twin a few predictions
            break
        if not p.capacity_rps or skip(p) or p.key == cand.key or not in_space(runner, p.config):
            continue
        looked += 1
        p = simplest(twin, p, canonical, lambda q: skip(q) or not in_space(runner, q.config), noise_floor,
                     runner.defaults, start_rate=start_rate)
        if any(p.key == c.key or _near(p, c, noise_floor) for c in chosen):
            continue
        chosen.append(p)
    runner.prefetch([(c.config, expect(c)) for c in chosen[1:]])


def _near(a: Prediction, b: Prediction, floor: float) -> bool:
    differ = {k for k in {*a.knobs, *b.knobs} if a.knobs.get(k) != b.knobs.get(k)}
    return len(differ) <= 1 and bool(a.capacity_rps and b.capacity_rps) and \
        abs(a.capacity_rps / b.capacity_rps - 1) <= floor


def in_space(runner: TrialRunner, knobs: Knobs) -> bool:
    """Every knob of the space at one of its values, an unset knob at the value vLLM gives it (a space that
    lists only 32 and 128 sequences does not hold vLLM's default of 256)."""
    for name, spec in runner.space.knobs.items():
        values = list(spec.values)
        if getattr(knobs, name) is None and None in values:
            continue
        if current_value(knobs, name, runner.defaults) not in values:
            return False
    return True


def simplest(twin: Twin, cand: Prediction, canonical: Callable[[Knobs], Knobs], skip: Callable[[Prediction], bool],
             floor: float, defaults: dict, *, start_rate: float) -> Prediction:
    """`cand` less every knob the twin predicts to matter less than a kept knob must (`share_needed`),
    tried in the recommendation's fixed removal order (output-changing first), each drop judged against the
    whole candidate so that small shares cannot add up to a loss. A drop that leads to a configuration
    already launched, or not allowed, is not taken: the candidate stays something new to measure."""
    if not cand.capacity_rps:
        return cand
    knobs, best = dict(cand.knobs), cand
    for knob in removal_order(changed_knobs(knobs, defaults)):
        trial = canonical(Knobs.stored({k: v for k, v in knobs.items() if k != knob}))
        p = twin.predict(trial, start_rate=start_rate)
        if skip(p) or not p.capacity_rps or p.capacity_rps * (1 + share_needed(knob, floor)) < cand.capacity_rps:
            continue
        knobs, best = trial.set_only(), p
    return best
