"""Trials side by side on one host: one `tune worker` process per device set beyond the first.

The study's storage is the queue (Optuna's WAITING trials, popped atomically: `tuner.search.worker`), as
for workers on other hosts; this module only starts them, each confined to its set (`tuner.devices.pin`),
and stops them. The `tune` process keeps the first set and runs the strategy: what it asks for next is
measured in its own process as before, and what a strategy expects to ask for after that
(`TrialRunner.prefetch`) is queued for the workers, so a batch never changes what a sequential study
decides except by measuring more.

No process outlives the tool: each worker gets SIGTERM from the kernel when `tune` dies
(`PR_SET_PDEATHSIG`), stops its server and queues its trial again; a worker's own servers have their
watchdogs (`tuner.engine.watchdog`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Sequence

from tuner import signals
from tuner.devices import DeviceKind, DeviceSet, host_ids, label, leftover, parse_ids, parse_sets, pin, pinned, split
from tuner.engine.launcher import pdeathsig_preexec
from tuner.engine.registry import engine_class
from tuner.errors import UserError
from tuner.limits import MAX_SECONDS
from tuner.profiles.host import gpus
from tuner.search.runner import TrialRunner
from tuner.search.space import SearchSpace
from tuner.settings import DeviceOptions, RunSettings

#: how long a worker may take to stop its server and record its trial after SIGTERM
STOP_GRACE_S = 60.0
#: how long a worker may take to start (imports, reading the study and its inputs) before the study goes on
READY_TIMEOUT_S = 120.0
#: the file a worker started by the pool creates once it is ready to pop the queue
READY_ENV = "TUNER_WORKER_READY_FILE"


class DevicePlan(NamedTuple):
    kind: DeviceKind
    sets: list[DeviceSet]
    left: list[int]    # the host's devices given but in no set (fewer than a set's size were left)


def resolve_sets(options: DeviceOptions, *, engine: str, gpu_count: int, layout_sizes: Sequence[int],
                 simulated_gpus: int | None = None, simulated: bool = False) -> DevicePlan:
    """The run's device kind, its disjoint sets and the host's devices left out of every set, checked
    against this host: unknown ids, GPUs on a host without any, a set smaller than a tensor-parallel
    layout of the space (`layout_sizes`: the devices each layout of the space needs). A simulated engine's
    GPUs are the simulated host's (`simulated_gpus`; None: as many as asked for)."""
    kind: DeviceKind = options.kind or ("gpu" if engine == "vllm" and gpu_count else "cpu")
    if kind == "gpu" and not gpu_count and not simulated:
        raise UserError("this host has no GPU (nvidia-smi lists none); --device-kind cpu sets CPU cores apart",
                        field="--device-kind")
    where = "--device-sets" if options.sets is not None else "--devices"
    given = [i for s in parse_sets(options.sets) for i in s] if options.sets is not None else \
        parse_ids(options.ids) if options.ids is not None else None
    if kind == "gpu" and simulated:
        host = list(range(simulated_gpus)) if simulated_gpus else (given or [0])
    else:
        host = host_ids(kind, gpu_count)
    wanted = host if given is None else given
    unknown = [i for i in wanted if i not in host]
    if unknown:
        what = "simulated GPUs" if kind == "gpu" and simulated else "GPUs" if kind == "gpu" else \
            "cores this process may use"
        raise UserError(f"device {unknown[0]} is not on this host (its {what}: {label(tuple(host)) or 'none'})",
                        field=where)
    if options.sets is not None:
        sets = parse_sets(options.sets)
    else:
        size = options.set_size or max(layout_sizes, default=1)
        try:
            sets = split(wanted, size)
        except ValueError as e:
            raise UserError(str(e), field="--set-size") from None
    need = max(layout_sizes, default=1)
    if kind == "gpu" and need > len(sets[0]):
        raise UserError(f"a trial of the search space needs {need} GPUs (tensor x pipeline parallel) and a "
                        f"device set has {len(sets[0])}: give sets of {need}, or leave that layout out of "
                        "the space", field="--set-size" if options.sets is None else "--device-sets")
    return DevicePlan(kind, sets, leftover(wanted, sets))


class WorkerPool:
    """`tune worker` processes on the study in `run_dir`, one per set in `sets` (the caller keeps its
    own set); each pins itself to its set before it imports an engine."""

    def __init__(self, run_dir: Path, kind: DeviceKind, sets: Sequence[DeviceSet], *,
                 api_key: str | None = None, storage: str | None = None) -> None:
        self.run_dir, self.kind, self.sets, self.api_key, self.storage = run_dir, kind, list(sets), api_key, storage
        self.procs: dict[str, subprocess.Popen] = {}

    def __enter__(self) -> "WorkerPool":
        logs = self.run_dir / "workers"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key  # never on a command line
        if self.storage:
            env["TUNER_STORAGE_URL"] = self.storage  # nor a database URL (it may carry a password)
        for s in self.sets:
            name = label(s)
            argv = [sys.executable, "-m", "tuner.cli", "worker", "--out", str(self.run_dir),
                    "--device-kind", self.kind, "--device-set", name, "--idle-exit", str(MAX_SECONDS)]
            stem = logs / f"set-{name.replace(',', '_')}"
            ready = stem.with_suffix(".ready")
            ready.unlink(missing_ok=True)
            with open(stem.with_suffix(".log"), "ab") as log:
                self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                    env={**env, READY_ENV: str(ready)}, stdin=subprocess.DEVNULL,
                                                    preexec_fn=pdeathsig_preexec(signal.SIGTERM))
        self._wait_ready(logs)
        return self

    def _wait_ready(self, logs: Path) -> None:
        """Until every worker has read the study and is about to pop the queue (or has exited): the
        strategy's first queued configurations then find their sets working, not still importing."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        for name, p in self.procs.items():
            ready = logs / f"set-{name.replace(',', '_')}.ready"
            while not ready.exists() and p.poll() is None and time.monotonic() < deadline:
                signals.check()
                time.sleep(0.05)

    def alive(self, name: str) -> bool:
        """Whether the worker of set `name` still runs (a trial it holds will be told)."""
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def __exit__(self, *exc: object) -> None:
        self.stop()  # a second stop is a no-op: every worker has exited

    def stop(self) -> dict[str, int]:
        """SIGTERM every worker (each records its trial as interrupted and queues it again), wait for them
        to stop their servers, then SIGKILL what is left. Returns the exit codes of the workers that had
        stopped before they were asked to (by set)."""
        early = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return early


def device_plan(settings: RunSettings, space: SearchSpace) -> DevicePlan | None:
    """The run's device sets (`tuner.search.pool.resolve_sets`), checked against this host and the space;
    None: one trial at a time on the whole host, as without `--devices`/`--set-size`/`--device-sets`."""
    if not settings.devices.given:
        return None

    def values(knob: str) -> list[int]:
        spec = space.knobs.get(knob)
        return [v or 1 for v in spec.values] if spec is not None else [1]

    sizes = [space.host_gpus] if space.host_gpus else [t * d for t in values("tensor_parallel_size")
                                                       for d in values("data_parallel_size")]
    simulated = engine_class(settings.engine.name).simulated
    kind, sets, left = resolve_sets(settings.devices, engine=settings.engine.name,
                                    gpu_count=0 if simulated else len(gpus()), layout_sizes=sizes,
                                    simulated=simulated, simulated_gpus=space.host_gpus)
    if space.host_gpus and kind == "gpu" and space.host_gpus != len(sets[0]):
        raise UserError(f"the search space fills a host of {space.host_gpus} GPUs (host_gpus) and each device "
                        f"set has {len(sets[0])}: set host_gpus to {len(sets[0])}, or give sets of "
                        f"{space.host_gpus}", field="--set-size" if settings.devices.sets is None else "--device-sets")
    return DevicePlan(kind, sets, left)


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr)


@contextmanager
def side_by_side(runner: TrialRunner, plan: DevicePlan | None, out: Path, api_key: str | None,
                 say: Any, storage: str | None = None) -> Iterator[None]:
    """This process on the first device set, a `tune worker` on each other one (`tuner.search.pool`) for
    what the strategy queues ahead; at the end the workers are stopped (each queues its unfinished trial
    again) and what was queued ahead and not run is recorded as interrupted, never as measured."""
    if plan is None:
        yield
        return
    if plan.left:
        say(f"device{'s' * (len(plan.left) > 1)} {label(tuple(plan.left))} left out: not a whole set")
    if len(plan.sets) == 1:
        runner.device_set = label(plan.sets[0])
        try:
            with pinned(plan.kind, plan.sets[0]):
                yield
        finally:
            runner.device_set = None  # what runs after the search has the whole host
        return
    say(f"{len(plan.sets)} device sets ({'; '.join(label(s) for s in plan.sets)}): this process runs trials "
        f"on {label(plan.sets[0])}, a worker on each other set runs the configurations queued ahead")
    # the workers first: a process started after this one is pinned would inherit its set
    with WorkerPool(out, plan.kind, plan.sets[1:], api_key=api_key, storage=storage) as pool, \
            pinned(plan.kind, plan.sets[0]):
        runner.device_set = label(plan.sets[0])
        runner.helpers, runner.helper_alive = len(plan.sets) - 1, pool.alive
        try:
            yield
        finally:
            with signals.shielded():
                early = pool.stop()
                runner.helpers, runner.device_set = 0, None  # what runs after the search has the whole host
                runner.cancel_prefetched()
            for name, code in early.items():
                say(f"warning: the worker of device set {name} stopped early (exit {code}); its log: "
                    f"{out / 'workers'}")


def pin_worker(devices: DeviceOptions) -> str | None:
    """`tune worker --device-set`: this worker on those devices (checked against this host), and their
    label for its records; None: the whole host."""
    if devices.ids is not None and os.environ.get(READY_ENV) and devices.kind is not None:
        # started by a pool (`WorkerPool`): the `tune` that started it checked its set against the host and
        # the study's engine (a simulated engine's GPUs are no GPUs of this host), so it is taken as given
        s = tuple(parse_ids(devices.ids))
        pin(devices.kind, s)
        return label(s)
    if devices.ids is None:
        if devices.kind is not None:
            raise UserError("gives the kind of --device-set's devices: give --device-set too", field="--device-kind")
        return None
    try:
        plan = resolve_sets(devices.model_copy(update={"set_size": len(parse_ids(devices.ids))}), engine="vllm",
                            gpu_count=len(gpus()), layout_sizes=[])
    except UserError as e:  # the worker's option is --device-set
        raise UserError(e.message, field="--device-set" if e.field == "--devices" else e.field) from None
    pin(plan.kind, plan.sets[0])
    return label(plan.sets[0])
