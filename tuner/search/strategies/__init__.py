"""Strategies by name: the one table `tune --strategy` picks from, and the door an outside strategy joins by.

Like the engines (`tuner.engine.registry`), a built-in is a row of `BUILTIN` (its module, imported only
when used: the twin needs the simulator, guided does not), and a strategy outside the package registers
itself::

    from tuner.search.strategies import StrategyRun, register_strategy

    @register_strategy("first-only")
    def first_only(run: StrategyRun) -> Outcome:
        base = run.runner.evaluate(Knobs(), role="baseline")
        return Outcome(base, base if base.capacity_rps else None, "one launch")

`tune --strategy first-only` then runs a study with it. A strategy decides which configurations to
launch, through `run.runner` (the only thing that launches and measures) within `run.budget`, and says
what it stands on (`Outcome`); the study runner around it does the rest (storage, attribution, reports).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from tuner.capacity.measure import LoadSettings
from tuner.errors import UserError
from tuner.search.runner import TrialRunner
from tuner.search.strategy import Budget, Outcome
from tuner.settings import RunSettings
from tuner.slo import SLO
from tuner.workload.model import Workload

#: Built-in strategies: name -> the module that registers it (imported on first use).
BUILTIN: dict[str, str] = {
    "guided": "tuner.search.strategies.guided",
    "twin": "tuner.search.strategies.twin",
    "tpe": "tuner.search.strategies.sampled",
    "random": "tuner.search.strategies.sampled",
    "grid": "tuner.search.strategies.grid",
}


@dataclass
class StrategyRun:
    """What a strategy is given: the trial runner, the budget, the run's settings and its inputs."""

    runner: TrialRunner
    budget: Budget
    settings: RunSettings
    workload: Workload
    slo: SLO
    load: LoadSettings
    say: Callable[[str], None] | None = None  # a line about the search itself (the progress display's)

    def note(self, text: str) -> None:
        if self.say is not None:
            self.say(text)


@dataclass(frozen=True)
class Strategy:
    name: str
    run: Callable[[StrategyRun], Outcome]
    #: A resumed study: True when the strategy reads each stored launch back where it made it (and counts
    #: it then), so it decides exactly as the first time; False: every stored launch counts at once.
    replays_stored: bool = False


_registered: dict[str, Strategy] = {}


def register_strategy(name: str, *, replays_stored: bool = False
                      ) -> Callable[[Callable[[StrategyRun], Outcome]], Callable[[StrategyRun], Outcome]]:
    """Function decorator: make `fn(run: StrategyRun) -> Outcome` available as `--strategy name`."""

    def deco(fn: Callable[[StrategyRun], Outcome]) -> Callable[[StrategyRun], Outcome]:
        if not callable(fn):
            raise TypeError(f"{fn!r} is not a strategy")
        _registered[name] = Strategy(name, fn, replays_stored)
        return fn

    return deco


def names() -> tuple[str, ...]:
    """Every strategy `get` can find: the built-ins, then the registered ones."""
    return tuple(dict.fromkeys([*BUILTIN, *_registered]))


def get(name: str) -> Strategy:
    if name not in _registered and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
    if name not in _registered:
        raise UserError(f"unknown strategy {name!r} (known: {', '.join(names())})", field="--strategy")
    return _registered[name]
