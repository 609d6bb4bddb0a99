"""Was a load run the server's measurement, or the client's own waiting? (docs/measurement.md, "Who gets
the CPU".)

A client measures what it waits for, and on a small host that includes waiting for a CPU: on a 2-core
host where vLLM's engine threads busy-poll, a client that the scheduler served late read whole responses
at once, hundreds of ms after the server had streamed them (mean TTFT 300-600 ms where vLLM's own
histogram said 10 ms). Such a run says nothing about the server, so it is neither a pass nor a fail.
Three witnesses, each independent of the client's latency figures:

- the send lateness of every request (`sent_s - scheduled_s`): an open-loop client that sends late has
  fallen behind its own schedule;
- the server's own histograms over the same run (`vllm:time_to_first_token_seconds`, E2E, queue time):
  a client whose mean TTFT exceeds the server's by more than the bound was measuring itself (vLLM's
  histogram starts when the API server has parsed the request and ends when the first token leaves the
  engine, so a healthy client reads a few ms more: 2-3 ms on the tiny model on 2 cores);
- the HTTP simulator's step loop (`sim:step_lateness_seconds`): a simulated GPU whose steps were delivered
  late because its host was busy measured the host.

The client's run-queue wait (Linux schedstat) is recorded beside them as evidence of why.
"""

from __future__ import annotations

import math

from tuner.metrics.parse import E2EL, QUEUE_TIME, TTFT
from tuner.replay.record import LoadRun
from tuner.storage.records import ClientCheck
from tuner.replay.schedule import percentile

#: A run is the client's when its sends were this late (p99), or its mean TTFT exceeded the server's by
#: this much: 50 ms, or 5% of the SLO's TTFT bound when that is larger.
BOUND_MS = 50.0
SLO_SHARE = 0.05
#: The HTTP simulator's steps may be late by this share of the bound on average (5 ms by default: a
#: quiet host's asyncio timer is ~1 ms late).
SIM_SHARE = 0.1
#: The server's histograms are compared only when they counted about the client's requests (another
#: client on the same server would make the means incomparable).
MIN_REQUESTS = 20
COUNT_MATCH = 0.2
SIM_STEPS = "sim:step_lateness_seconds"
SIM_STEP_COUNT = "sim:engine_steps"


def bound_ms(ttft_max_ms: float | None = None) -> float:
    """The stated bound: 50 ms, or 5% of the SLO's TTFT threshold when larger."""
    if ttft_max_ms is None or not math.isfinite(ttft_max_ms):
        return BOUND_MS
    return max(BOUND_MS, SLO_SHARE * ttft_max_ms)


def _mean_ms(values: list[float]) -> float | None:
    return 1000.0 * sum(values) / len(values) if values else None


def check_run(run: LoadRun, bound: float = BOUND_MS) -> ClientCheck:
    """The run's own truth about itself; sets and returns `run.client_check`."""
    sent = [r for r in run.records if r.sent_s is not None]
    late = [1000.0 * (r.sent_s - r.scheduled_s) for r in sent if r.sent_s is not None]
    ttft = [r.ttft for r in sent if r.ttft is not None]
    e2e = [r.e2el for r in sent if r.e2el is not None]
    c = ClientCheck(bound_ms=bound, lateness_p99_ms=percentile(late, 99) if late else None,
                    client_ttft_mean_ms=_mean_ms(ttft), client_e2e_mean_ms=_mean_ms(e2e))
    mw = run.metrics
    if mw is not None:
        for key, attr in ((TTFT, "server_ttft_mean_ms"), (E2EL, "server_e2e_mean_ms"),
                          (QUEUE_TIME, "server_queue_mean_ms")):
            h = mw.histograms.get(key)
            if h is not None and h.count >= MIN_REQUESTS and \
                    abs(h.count - len(ttft)) <= COUNT_MATCH * max(h.count, len(ttft)):
                setattr(c, attr, 1000.0 * h.sum / h.count)
        steps = mw.counter(SIM_STEP_COUNT)
        if steps > 0:
            c.sim_step_lateness_ms = 1000.0 * mw.counter(SIM_STEPS) / steps
    wall = run.duration_s * run.time_scale
    if run.client_runq_s is not None and wall > 0:
        c.client_runq_share = min(1.0, run.client_runq_s / wall)
    if run.client_cpu_s is not None and wall > 0:
        c.client_cpu_share = run.client_cpu_s / wall
    if c.lateness_p99_ms is not None and c.lateness_p99_ms > bound:
        c.reasons.append(f"sends p99 {c.lateness_p99_ms:.0f} ms late (bound {bound:.0f} ms)")
    if c.client_ttft_mean_ms is not None and c.server_ttft_mean_ms is not None \
            and c.client_ttft_mean_ms - c.server_ttft_mean_ms > bound:
        c.reasons.append(f"client mean TTFT {c.client_ttft_mean_ms:.0f} ms exceeds the server's own "
                         f"{c.server_ttft_mean_ms:.0f} ms by more than {bound:.0f} ms")
    if c.sim_step_lateness_ms is not None and c.sim_step_lateness_ms > SIM_SHARE * bound:
        c.reasons.append(f"the simulator's steps were {c.sim_step_lateness_ms:.1f} ms late on average "
                         f"(bound {SIM_SHARE * bound:.0f} ms): its host, not the simulated GPU, set the pace")
    run.client_check = c
    return c


def voids(check: ClientCheck, passed: bool, reason: str) -> bool:
    """Whether a client-bound flag voids the run's verdict (the run is then measured again).

    A pass always: late sends offered less than the nominal rate, so the pass may be the client's. A
    failure on errors never: failed requests are the server's (a server dropping connections under load).
    A latency or overload failure only when the server's own queue time does not confirm it: a server
    whose own histogram says requests waited more than the bound on average was overloaded whatever the
    client saw, while a starved client reads ends late and its in-flight count seems to grow by itself.
    """
    if not check.client_bound:
        return False
    if passed:
        return True
    if reason == "errors":
        return False
    return check.server_queue_mean_ms is None or check.server_queue_mean_ms <= check.bound_ms
