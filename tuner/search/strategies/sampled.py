"""`--strategy tpe` and `--strategy random`: the whole space searched blind by an Optuna sampler, after
the same baseline as every strategy (what peer tools do; for comparison and for users who want them)."""

from __future__ import annotations

import optuna

from tuner.knobs import Knobs
from tuner.search.runner import TrialRunner
from tuner.search.strategies import StrategyRun, register_strategy
from tuner.search.strategy import Budget, Outcome, accept_floor, fitted_baseline
from tuner.storage.optuna_study import prune, use_sampler


@register_strategy("tpe")
def tpe(run: StrategyRun) -> Outcome:
    return whole_space(run.runner, run.budget, sampler="tpe", noise_floor=run.settings.noise_floor,
                       seed=run.settings.seed)


@register_strategy("random")
def random(run: StrategyRun) -> Outcome:
    return whole_space(run.runner, run.budget, sampler="random", noise_floor=run.settings.noise_floor,
                       seed=run.settings.seed)


def whole_space(runner: TrialRunner, budget: Budget, *, sampler: str, noise_floor: float,
                seed: int = 0, race: bool = False) -> Outcome:
    """Peer-style blind search over the whole space, after the same baseline trial."""
    base = fitted_baseline(runner, budget)
    if base.launch_failure_kind == "client_bound":
        return Outcome(base, None, f"the load client could not measure the baseline: {base.launch_failure_message}")
    if base.launch_failure_kind == "requests_failed" and not (base.diagnosis and base.diagnosis.knobs):
        return Outcome(base, None, f"the baseline failed its requests: {base.launch_failure_message}")
    best = base if base.capacity_rps else None
    use_sampler(runner.study, sampler, {k: [v for v in runner.choices(k) if v is not None] or [None]
                                        for k in runner.space.knobs}, seed=seed)
    seen = set(runner.finished())
    stale = 0
    while budget.left(runner) and stale < 50:
        trial, knobs = _propose(runner, seen)
        if knobs is None:
            stale += 1
            continue
        stale = 0
        # with other device sets: the sampler's next proposals measured beside this one, each judged in turn
        # after it, as a sequential study would have judged them
        ahead = _propose_ahead(runner, budget, seen, start=best.capacity_rps if best else None)
        floor = accept_floor(best, noise_floor) if best else None
        rec = runner.run_trial(trial, role=sampler, race_rate=floor if race else None,
                               start_rate=(best.capacity_rps if best else None),
                               incumbent=best.capacity_rps if best else None, accept_above=floor)
        if rec.accepted:
            best = rec
        for other in ahead:
            if not budget.left(runner):
                break
            floor = accept_floor(best, noise_floor) if best else None
            rec = runner.evaluate(other, role=sampler, start_rate=best.capacity_rps if best else None,
                                  incumbent=best.capacity_rps if best else None, accept_above=floor)
            if rec.accepted:
                best = rec
    return Outcome(base, best, "budget spent" if stale < 50 else "space exhausted")


def _propose(runner: TrialRunner, seen: set[str]) -> tuple[optuna.Trial | None, Knobs | None]:
    """The sampler's next configuration as an asked trial; (None, None) when it proposed one already
    seen or one the space or the study's lessons rule out (that trial is pruned: the sampler learns from
    it, as Optuna's own studies do)."""
    trial = runner.ask({}, sample=bool(runner.helpers))
    picked = {k: trial.suggest_categorical(k, runner.choices(k)) for k in runner.space.knobs}
    knobs = runner.space.layout(Knobs.stored({k: v for k, v in picked.items() if v is not None}))
    if knobs.key() in seen or runner.space.allows(knobs, runner.defaults) or \
            runner.lessons().broken_by(knobs, runner.defaults):
        prune(runner.study, trial)
        runner.current = None
        return None, None
    seen.add(knobs.key())
    return trial, knobs


def _propose_ahead(runner: TrialRunner, budget: Budget, seen: set[str], start: float | None) -> list[Knobs]:
    """As many further proposals as there are idle device sets (and budget), queued for their workers
    (`TrialRunner.prefetch`): Optuna's parallel asking, where each worker asks the shared study for its
    own trial. Each proposal is an asked trial, pruned once its configuration is handed over (as every
    proposal this process does not run is), so the sampler's next proposal is another; the sampler sees
    that pruned proposal beside the worker's measured trial of the same configuration, once it completes.
    A batch's proposals are made before the results of the batch: with one set, the sampler would have
    seen each result first."""
    free = min(runner.helpers - runner.in_flight(), budget.max_trials - runner.launches - 1 - runner.in_flight())
    out: list[Knobs] = []
    tries = 0
    while len(out) < free and tries < 4 * free:
        tries += 1
        trial, knobs = _propose(runner, seen)
        if trial is None or knobs is None:
            continue
        prune(runner.study, trial)
        runner.current = None
        out.append(knobs)
    runner.prefetch([(k, start) for k in out])
    return out
