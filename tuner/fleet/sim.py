"""A fleet in virtual time: N simulated engines behind the router model, with failures and an autoscaler.

Each replica is its own `EngineCore` (the simulated vLLM V1 scheduler and cost model of one `vllm serve`
with the tuned configuration): its own queue, KV pool and prefix cache. One clock drives them all: the
next event is either an arrival (routed at once by the policy, from the router's in-flight counts), a
replica's step ending (its finished requests leave the router's count, and it starts its next step), or
a scheduled event (a replica fails, a launched replica becomes ready, the autoscaler's tick). Requests
that arrive while a replica is mid-step wait for the step's end, as in `tuner.engine.virtual`.

A failed replica's in-flight requests fail ("replica down"), and the router stops sending to it at once
(the real router needs a few failed health checks; its retries resend the failed requests, which is not
modelled: they count as failed). A replica scaled down leaves the router at once and is stopped when its
last in-flight request ends (drain before scale-down). A launched replica serves after `cold_start_s`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tuner.fleet.policies import RouteKey, RoutingPolicy
from tuner.replay.record import RequestRecord
from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostParams
from tuner.sim.engine import EngineCore, Seq

DOWN = "replica down"
TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class FleetRequest:
    """One request of the fleet's load: when it arrives, its lengths, and what the router reads."""

    arrival: float
    prompt_len: int
    output_len: int
    key: RouteKey


@dataclass
class Replica:
    id: int
    core: EngineCore
    launched_at: float
    ready_at: float
    state: str = "starting"            # starting | ready | draining | dead | stopped
    stopped_at: float | None = None
    stepping: bool = False
    epoch: int = 0                      # bumped when it fails: its pending step end is void
    load: int = 0                       # the router's in-flight count
    routed: int = 0

    @property
    def serves(self) -> bool:
        return self.state in ("ready", "draining")


@dataclass
class Sample:
    """The fleet once a second: what an operator's dashboard (and the autoscaler) sees."""

    t: float
    ready: int
    starting: int
    draining: int
    waiting: int                        # summed vllm:num_requests_waiting of serving replicas
    running: int


@dataclass
class FleetRun:
    records: list[RequestRecord]
    replica_of: list[int]               # each request's replica (-1: none would take it)
    replicas: list[Replica]
    samples: list[Sample]
    duration_s: float
    decisions: dict[str, int] = field(default_factory=dict)
    scale_events: list[tuple[float, str, int]] = field(default_factory=list)  # (t, "up"|"down", replicas)

    def replica_seconds(self) -> float:
        """Replica-seconds paid for: from launch to stop (or the run's end)."""
        return sum((r.stopped_at if r.stopped_at is not None else self.duration_s) - r.launched_at
                   for r in self.replicas)


@dataclass
class Autoscaler:
    """KEDA's Prometheus trigger on sum(vllm:num_requests_waiting) as the HPA applies it: desired =
    ceil(sum / threshold), within [min, max]; scale-up at the next tick, scale-down only when every
    desired value of the last `cooldown_s` was below the current count (the HPA's stabilisation
    window), one replica at a time, drained first."""

    threshold: float
    min_replicas: int
    max_replicas: int
    tick_s: float = 15.0
    cooldown_s: float = 120.0
    history: list[tuple[float, int]] = field(default_factory=list)

    def decide(self, t: float, waiting: int, current: int) -> int:
        desired = max(self.min_replicas, min(self.max_replicas, math.ceil(waiting / self.threshold)))
        self.history.append((t, desired))
        if desired > current:
            return desired
        window = [d for (s, d) in self.history if s > t - self.cooldown_s]
        if t - self.history[0][0] >= self.cooldown_s and max(window) < current:
            return current - 1
        return current


class Fleet:
    """The event loop over the replicas (see the module's docstring)."""

    def __init__(self, cfg: ResolvedConfig, policy: RoutingPolicy, replicas: int, *,
                 cost_params: CostParams | None = None, noise: float = 0.0, seed: int = 0,
                 cold_start_s: float = 0.0, token_times: bool = False):
        self.cfg, self.policy, self.cost_params = cfg, policy, cost_params
        self.noise, self.seed, self.cold_start_s = noise, seed, cold_start_s
        self.keep_times = token_times
        self.replicas: list[Replica] = []
        self.events: list[tuple[float, int, int, str, Any]] = []
        self._n = 0
        self.scale_events: list[tuple[float, str, int]] = []
        for _ in range(replicas):
            self.launch(0.0, ready_now=True)

    # -- replicas -----------------------------------------------------------------------------
    def launch(self, t: float, ready_now: bool = False) -> Replica:
        k = len(self.replicas)
        core = EngineCore(self.cfg, self.cost_params, noise=self.noise, seed=self.seed + 7919 * k,
                          keep_step_times=self.keep_times)
        r = Replica(id=k, core=core, launched_at=t, ready_at=t if ready_now else t + self.cold_start_s,
                    state="ready" if ready_now else "starting")
        self.replicas.append(r)
        if not ready_now:
            self._push(r.ready_at, "ready", r)
        return r

    def fail(self, t: float, replica: int | None = None, relaunch: bool = False) -> None:
        """Schedule a replica's failure at `t` (default: the first serving one at that time); with
        `relaunch`, its replacement is launched at once and serves `cold_start_s` later."""
        self._push(t, "fail", (replica, relaunch))

    def _push(self, t: float, kind: str, payload: Any, epoch: int = 0) -> None:
        self._n += 1
        heapq.heappush(self.events, (t, self._n, epoch, kind, payload))

    def serving(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "ready"]

    def _step(self, r: Replica, t: float) -> None:
        dur, finished = r.core.step(t)
        r.stepping = True
        self._push(t + max(dur, 1e-6), "step", (r, finished), r.epoch)

    # -- the run ------------------------------------------------------------------------------
    def run(self, requests: Sequence[FleetRequest], *, timeout_s: float = 60.0,
            autoscaler: Autoscaler | None = None, sample_s: float = 1.0,
            on_tick: Callable[[float, "Fleet"], None] | None = None) -> FleetRun:
        n = len(requests)
        seqs: list[Seq | None] = [None] * n
        where = [-1] * n
        errors: dict[int, str] = {}
        last = requests[-1].arrival if n else 0.0
        horizon = last + timeout_s
        self._push(0.0, "sample", None)
        if autoscaler is not None:
            self._push(autoscaler.tick_s, "tick", autoscaler)
        samples: list[Sample] = []
        i = 0
        t = 0.0
        while True:
            t_arr = requests[i].arrival if i < n else math.inf
            t_ev = self.events[0][0] if self.events else math.inf
            if t_arr == math.inf and (t_ev == math.inf or not self._busy()):
                break
            if t_arr <= t_ev:
                t = t_arr
                self._arrive(requests[i], i, t, seqs, where, errors)
                i += 1
                continue
            t, _, epoch, kind, payload = heapq.heappop(self.events)
            if t > horizon:
                break
            if kind == "step":
                self._step_end(t, payload[0], payload[1], epoch)
            elif kind == "sample":
                samples.append(self._sample(t))
                if i < n or self._busy():
                    self._push(t + sample_s, "sample", None)
            elif kind == "ready":
                if payload.state == "starting":
                    payload.state = "ready"
            elif kind == "fail":
                self._fail(t, payload[0], seqs, errors)
                if payload[1]:
                    self.launch(t)
            elif kind == "tick":
                self._autoscale(t, payload)
                if i < n or self._busy():
                    self._push(t + payload.tick_s, "tick", payload)
            if on_tick is not None:
                on_tick(t, self)
        end = max(t, last)
        for r in self.replicas:
            if r.state == "draining" and not r.core.has_work():
                r.state, r.stopped_at = "stopped", end
        records = [self._record(k, req, seqs[k], errors.get(k), timeout_s, end,
                                self.replicas[where[k]] if where[k] >= 0 else None)
                   for k, req in enumerate(requests)]
        decisions = dict(getattr(self.policy, "decisions", {}))
        return FleetRun(records=records, replica_of=where, replicas=self.replicas, samples=samples,
                        duration_s=end, decisions=decisions, scale_events=list(self.scale_events))

    def _step_end(self, t: float, r: Replica, finished: list[Seq], epoch: int) -> None:
        """A replica's step ended: its finished requests leave the router's count; it steps again, or a
        draining replica with nothing left stops."""
        if epoch != r.epoch:
            return  # it failed mid-step
        r.stepping = False
        r.load -= len(finished)
        if r.core.has_work():
            self._step(r, t)
        elif r.state == "draining":
            r.state, r.stopped_at = "stopped", t

    def _busy(self) -> bool:
        return any(r.core.has_work() for r in self.replicas if r.state != "dead")

    def _arrive(self, req: FleetRequest, k: int, t: float, seqs: list, where: list, errors: dict) -> None:
        ready = self.serving()
        if not ready:
            errors[k] = "no replica serving"
            return
        # the router's list: every worker it was given and has not removed (dead ones stay listed)
        loads = {r.id: r.load for r in self.replicas if r.state in ("ready", "dead")}
        rid = self.policy.select(req.key, [r.id for r in ready], loads)
        r = self.replicas[rid]
        where[k] = rid
        err = r.core.check(req.prompt_len, req.output_len)
        if err:
            errors[k] = err
            return
        seq = Seq(rid=k, arrival=t, prompt_len=req.prompt_len, output_len=req.output_len,
                  hashes=list(req.key.hashes))
        seqs[k] = seq
        r.core.add(seq)
        r.load += 1
        r.routed += 1
        if not r.stepping:
            self._step(r, t)

    def _fail(self, t: float, which: int | None, seqs: list, errors: dict) -> None:
        ready = self.serving()
        if not ready:
            return
        r = self.replicas[which] if which is not None else ready[0]
        r.state, r.stopped_at, r.load = "dead", t, 0
        r.epoch += 1
        r.stepping = False
        core = r.core
        for seq in list(core.running.values()) + list(core.waiting):
            if seq.finish is None:
                errors[seq.rid] = DOWN
        core.running.clear()
        core.waiting.clear()
        self.policy.forget(r.id)

    def _autoscale(self, t: float, scaler: Autoscaler) -> None:
        active = [r for r in self.replicas if r.state in ("ready", "starting")]
        waiting = sum(r.core.num_waiting for r in self.replicas if r.state == "ready")
        want = scaler.decide(t, waiting, len(active))
        if want > len(active):
            for _ in range(want - len(active)):
                self.launch(t)
            self.scale_events.append((t, "up", want))
        elif want < len(active):
            victim = min((r for r in active), key=lambda r: (r.state == "ready", r.load))
            if victim.state == "starting":
                victim.state, victim.stopped_at = "stopped", t
            else:
                victim.state = "draining"
                if not victim.core.has_work():
                    victim.state, victim.stopped_at = "stopped", t
            self.policy.forget(victim.id)
            self.scale_events.append((t, "down", want))

    def _sample(self, t: float) -> Sample:
        live = [r for r in self.replicas if r.serves]
        return Sample(t=t, ready=sum(r.state == "ready" for r in self.replicas),
                      starting=sum(r.state == "starting" for r in self.replicas),
                      draining=sum(r.state == "draining" for r in self.replicas),
                      waiting=sum(r.core.num_waiting for r in live), running=sum(r.core.num_running for r in live))

    def _record(self, k: int, req: FleetRequest, seq: Seq | None, error: str | None, timeout_s: float,
                end: float, replica: Replica | None) -> RequestRecord:
        first = finish = None
        out = 0
        cached = None
        times = None
        if seq is not None and error is None:
            cached = seq.cached_tokens if seq.first_scheduled is not None else None
            first = seq.first_token
            if seq.finish is not None and seq.finish - seq.arrival <= timeout_s:
                finish, out = seq.finish, seq.output_len
                if self.keep_times and seq.steps and replica is not None:
                    times = replica.core.token_times(seq)
            else:
                error, out = TIMEOUT, seq.produced
        return RequestRecord.model_construct(
            index=k, scheduled_s=req.arrival, sent_s=req.arrival, first_token_s=first, finish_s=finish,
            token_times=times, prompt_tokens=req.prompt_len, output_tokens=out,
            expected_output_tokens=req.output_len, error=error, in_window=True,
            end_s=finish if finish is not None else min(end, req.arrival + timeout_s), cached_tokens=cached)


__all__ = ["Fleet", "FleetRun", "FleetRequest", "Replica", "Sample", "Autoscaler", "DOWN", "TIMEOUT"]
