"""How precisely does the replay client keep an open-loop schedule?

Sends Poisson-timed streaming requests at several rates to the test server (tests/helpers/openai_server.py,
in its own process so it does not share the client's event loop or core) and prints, per rate, how late
requests went out relative to their schedule (p50/p99/max of `sent_s - scheduled_s`) and the achieved
versus target send rate. Target: p99 lateness under 5 ms at 200 req/s on a 2-core machine.

Lateness has two sources: the client's own event loop being busy, and the client not getting a core at
all. The last columns separate them: involuntary context switches per second and how many ms of every
second the event loop spent runnable but waiting for a core (other processes, including the server).

    .venv/bin/python benchmarks/replay_precision.py [--rates 50 200 500] [--duration 5] [--output-tokens 16]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.openai_server import start_server  # noqa: E402
from tuner.replay.client import run_load_http  # noqa: E402
from tuner.replay.schedule import percentile  # noqa: E402
from tuner.workload.model import WorkloadRequest  # noqa: E402


def poisson_times(rate: float, duration: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


def _runqueue_wait_s() -> float:
    """Seconds this process's main thread (the event loop) has spent runnable but waiting for a core
    (Linux /proc/self/schedstat, 2nd field, ns); 0 where unavailable."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def measure(base_url: str, rate: float, duration: float, output_tokens: int, prompt_tokens: int) -> dict:
    times = poisson_times(rate, duration, seed=int(rate))
    reqs = [WorkloadRequest(prompt_tokens=prompt_tokens, output_tokens=output_tokens) for _ in times]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    wait0 = _runqueue_wait_s()
    wall0 = time.monotonic()
    run = run_load_http(base_url, reqs, times, offered_rate=rate, metrics=True, sample_interval_s=0.5)
    wall = time.monotonic() - wall0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    waited = _runqueue_wait_s() - wait0
    sent = [r for r in run.records if r.sent_s is not None]
    late_ms = [(r.sent_s - r.scheduled_s) * 1e3 for r in sent]
    span = max(r.sent_s for r in sent) - min(r.sent_s for r in sent)
    target_span = max(times) - min(times)
    ok = [r for r in run.records if r.ok]
    return {
        "rate": rate, "n": len(times), "ok": len(ok), "errors": len(times) - len(ok),
        "late_p50": percentile(late_ms, 50), "late_p99": percentile(late_ms, 99), "late_max": max(late_ms),
        "target_rate": (len(times) - 1) / target_span, "achieved_rate": (len(sent) - 1) / span,
        "ttft_p50": percentile([r.ttft * 1e3 for r in ok], 50),
        "client_cpu": ((cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)) / wall,
        # Involuntary context switches per second: the client was runnable but another process had the
        # core. On a shared 2-core machine this, not the scheduler, is what makes sends late.
        "preempted_per_s": (cpu1.ru_nivcsw - cpu0.ru_nivcsw) / wall,
        # Of every second, how long the event loop was ready to run but had no core.
        "cpu_wait_ms_per_s": waited / wall * 1e3,
        "load": os.getloadavg()[0],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=[50, 200, 500])
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--ttft", type=float, default=0.02)
    p.add_argument("--tpot", type=float, default=0.01)
    p.add_argument("--repeat", type=int, default=1, help="measure each rate this many times")
    a = p.parse_args(argv)
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; server TTFT {a.ttft * 1e3:g} ms, "
          f"TPOT {a.tpot * 1e3:g} ms, {a.output_tokens} output tokens, {a.duration:g} s per rate")
    rows = []
    with start_server(ttft=a.ttft, tpot=a.tpot) as srv:
        run_load_http(srv.base_url, [WorkloadRequest(prompt_tokens=8, output_tokens=2)] * 20,
                      [i * 0.01 for i in range(20)], offered_rate=100, metrics=False)  # warm imports
        for rate in a.rates:
            for _ in range(a.repeat):
                rows.append(measure(srv.base_url, rate, a.duration, a.output_tokens, a.prompt_tokens))
    head = (f"{'rate':>6} {'n':>6} {'errors':>6} {'late p50 ms':>11} {'late p99 ms':>11} {'late max ms':>11} "
            f"{'target/s':>9} {'achieved/s':>10} {'TTFT p50 ms':>11} {'client CPU':>10} {'preempt/s':>9} {'CPU wait ms/s':>13} {'load':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['rate']:>6g} {r['n']:>6} {r['errors']:>6} {r['late_p50']:>11.3f} {r['late_p99']:>11.3f} "
              f"{r['late_max']:>11.3f} {r['target_rate']:>9.1f} {r['achieved_rate']:>10.1f} "
              f"{r['ttft_p50']:>11.2f} {r['client_cpu']:>10.0%} {r['preempted_per_s']:>9.0f} {r['cpu_wait_ms_per_s']:>13.0f} {r['load']:>5.2f}")


if __name__ == "__main__":
    main()
