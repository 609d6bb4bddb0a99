"""V0's multi-step scheduling (`--num-scheduler-steps N`, vLLM 0.5 to 0.7; gone with the V0 engine).

Decode steps run in bursts of N scheduled at once: nothing is admitted until the burst ends, and its
tokens (and its finishes) reach the client together at its end, as the output is processed once per
burst. So a request arriving mid-burst waits for the rest of it (light-load TTFT grows by about half a
burst) and the ITL between streamed chunks is N steps, while TPOT and throughput barely move. Published
runs of that era used it (benchmarks/data/calibration_published.yaml): without it their TTFT read 70-80%
low and their ITL 90% low. The engine core calls `multi_step` after each step when `multi_step > 1`.
"""

from __future__ import annotations

from typing import Any


def multi_step(core: Any, t: int, prefill: bool, end: float, finished: list) -> None:
    """Account step `t` (ended at `end`) to the current burst, opening one at a plain decode step and
    closing it after N steps or when no decode is left: its steps' token times and its finishes move to
    its end. A step that lands a prefill chunk is no part of a burst (V0 ran prompts as their own steps):
    one inside an open burst (a prompt longer than the budget its step had left) closes it first."""
    burst = core._burst
    if burst and prefill:
        _close(core, burst, t)
    if not burst:
        if prefill or not core.n_dec:
            return
        burst[:] = [t, core.multi_step, [], end]
    burst[1] -= 1
    burst[2].extend(finished)
    burst[3] = end
    if burst[1] <= 0 or not core.n_dec:
        _close(core, burst, t + 1)


def _close(core: Any, burst: list, upto: int) -> None:
    """The burst's steps up to index `upto` (excluded) reach the client at its last step's end."""
    first, _, done, end = burst
    if core.keep_step_times:
        core.step_end[first:upto] = [end] * (upto - first)
    for seq in done:
        seq.finish = end
    burst.clear()
