"""Precise waits on the asyncio loop, for sending requests at their scheduled times.

`asyncio.sleep` wakes up to about a millisecond late even on an idle loop (epoll rounds its timeout up to
whole milliseconds), and later on a busy one. An open-loop client that sends late under-measures queueing
exactly when the server is saturated, so the last stretch before a deadline is spent yielding
(`sleep(0)`) instead of sleeping: the loop keeps serving other streams meanwhile, it is never blocked.
"""

from __future__ import annotations

import asyncio
import time

#: Sleep normally until this long before the deadline, then yield in a loop.
SPIN_S = 0.001


async def sleep_until(deadline: float, *, spin_s: float = SPIN_S) -> None:
    """Return at `deadline` (a `time.monotonic()` value), or as soon after it as the loop allows."""
    delay = deadline - time.monotonic()
    if delay > spin_s:
        await asyncio.sleep(delay - spin_s)
    while time.monotonic() < deadline:
        await asyncio.sleep(0)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-interpolated percentile (q in 0..100), numpy's default rule; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
