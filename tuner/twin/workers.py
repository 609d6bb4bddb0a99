"""The twin's replays on every core: independent evaluations in forked worker processes.

Why: the twin's fit is a CMA-ES search whose every evaluation replays the launches on the simulator
(`tuner.twin.fit`), and on a 2-core host one core sat idle while the main job spent most of its minute
there. The evaluations of one CMA-ES generation are independent, and so are the launches one evaluation
replays, so they run side by side, launch by launch; the order in which trials are asked and told is kept
(`cma_batches`), so the fit's parameters, its loss and everything downstream are exactly those of the
one-process search.

Workers are forked (they inherit the fit's workload and observations without pickling them) and live for
one fit. `TUNER_TWIN_WORKERS=1` (or a single usable core, or a platform without fork) keeps everything in
this process.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import signal
from typing import Callable, Iterator, Sequence

import optuna

_TASK: Callable | None = None   # what a forked worker runs: set in the parent just before the fork


def worker_count() -> int:
    """Processes to use: `TUNER_TWIN_WORKERS`, else the usable cores (at most 2), 1 where fork is missing."""
    env = os.environ.get("TUNER_TWIN_WORKERS")
    if env:
        try:  # never more processes than cores (a typo of 10000 must not fork 10000 copies of the study)
            return max(1, min(int(env), os.cpu_count() or 1))
        except ValueError:
            return 1
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(2, cores))


def _quiet() -> None:
    """A worker leaves Ctrl-C to the parent (it reaches the whole process group; the parent stops the pool)
    and ends silently when the pool stops it, whatever handlers the study installed (`tuner.signals`).
    What it inherited is never collected here (`gc.freeze`): a parent's object awaiting collection (a
    database connection, a server's pipe) must not be finalised by a copy of it."""
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run(arg):
    assert _TASK is not None
    return _TASK(arg)


class Workers:
    """`map(args)`: `task(arg)` for each, in order, on `n` forked processes (here when `n` is 1)."""

    def __init__(self, task: Callable, n: int | None = None):
        self.task, self.n = task, worker_count() if n is None else n
        self._pool = None

    def __enter__(self) -> "Workers":
        global _TASK
        if self.n > 1:
            _TASK = self.task
            self._pool = multiprocessing.get_context("fork").Pool(self.n, initializer=_quiet)
        return self

    def __exit__(self, kind, *exc) -> None:
        global _TASK
        if self._pool is not None:
            if kind is None:
                self._pool.close()   # every task is done: the workers exit on their own
            else:
                self._pool.terminate()
            self._pool.join()
            self._pool = None
        _TASK = None

    def map(self, args: Sequence) -> list:
        if self._pool is None or len(args) < 2:
            return [self.task(a) for a in args]
        return self._pool.map(_run, list(args), chunksize=1)


def cma_popsize(dims: int, popsize: int | None = None) -> int:
    """The population of Optuna's CMA-ES over `dims` parameters (cmaes' default: 4 + floor(3 ln n))."""
    return popsize or 4 + math.floor(3 * math.log(dims))


def _system_attrs(study: optuna.Study, number: int) -> dict:
    """The sampler's notes on trial `number` (asked, maybe not yet told)."""
    return next((f.system_attrs for f in reversed(study.get_trials(deepcopy=False)) if f.number == number), {})


def cma_batches(study: optuna.Study, ask: Callable[[], optuna.trial.Trial], n_trials: int, popsize: int,
                generation_key: str = "cma:generation") -> Iterator[list]:
    """Asked trials in groups that may be evaluated together, each group told before the next is asked.

    Optuna's CMA-ES sampler draws a generation's members from one saved state and moves to the next
    generation when a member is asked after `popsize` were told; it reads that state back from the first
    member of the generation once told. So a trial without a generation (the start-up one) and the first
    member of each generation go alone, and the rest of a generation together: the same parameters, in
    the same order, as asking and telling one at a time."""
    asked = 0
    current, members = None, 0
    while asked < n_trials:
        t = ask()
        asked += 1
        g = _system_attrs(study, t.number).get(generation_key)
        if g is None or g != current:
            current, members = g, 1
            yield [t]
            continue
        batch = [t]
        members += 1
        while asked < n_trials and members < popsize:
            batch.append(ask())
            asked += 1
            members += 1
        yield batch
