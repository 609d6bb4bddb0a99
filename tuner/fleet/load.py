"""The fleet's offered load: the workload's requests at a rate that may change over time.

A profile is a list of (start second, req/s) steps; arrivals are a Poisson process at each step's rate
(or, for a timed trace, the trace's own timestamps rescaled so its mean rate is the step's). Requests are
the workload's, drawn in a seeded shuffled cycle; each use of a request gets prompt tokens unique to that
use beyond its shared prefix ids (as `tuner.engine.sim.request_shape` does per index), so a repeated
request does not fake a cache hit. The routing key is what the router would read: the prompt's block
hashes, and a session key (the request's tenant; `prefix` mode: its first block, i.e. its system prompt).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tuner.engine.sim import request_shape
from tuner.errors import UserError
from tuner.fleet.policies import RouteKey
from tuner.fleet.sim import FleetRequest
from tuner.tokens import BLOCK_SIZE, RegexCounter, TokenCounter
from tuner.workload.model import Workload, WorkloadRequest

SESSION_KEYS = ("tenant", "prefix", "none")


def arrivals(profile: Sequence[tuple[float, float]], duration_s: float, seed: int = 0,
             trace: Sequence[float] | None = None) -> list[float]:
    """Arrival times in [0, duration_s) for a piecewise-constant rate `profile` [(start, rate), ...]."""
    if not profile or profile[0][0] != 0.0:
        raise UserError("a load profile starts at second 0", field="profile")
    for _, rate in profile:
        if not (rate > 0 and math.isfinite(rate)):
            raise UserError(f"must be a number > 0, got {rate}", field="--peak-rate")
    rng = np.random.default_rng(seed)
    out: list[float] = []
    bounds = [s for s, _ in profile[1:]] + [duration_s]
    for (start, rate), end in zip(profile, bounds):
        if end <= start:
            continue
        if trace:
            span = trace[-1] - trace[0]
            mean = (len(trace) - 1) / span if span > 0 else rate
            scale = mean / rate  # trace seconds per fleet second
            t, off = start, 0.0
            while t < end:
                for x in trace:
                    at = start + off + (x - trace[0]) / scale
                    if at >= end:
                        break
                    out.append(at)
                off += (span + 1.0 / mean) / scale
                t = start + off
        else:
            n = int(rng.poisson(rate * (end - start)))
            out.extend(sorted(rng.uniform(start, end, size=n).tolist()))
    return sorted(out)


def draw(workload: Workload, n: int, seed: int = 0) -> list[WorkloadRequest]:
    """`n` of the workload's requests in a seeded shuffled cycle; from the second cycle on, a request's
    own prefix ids are new (its shared ones kept), so a reuse is a new prompt with the same shared prefix."""
    reqs = workload.requests
    if not reqs:
        raise UserError("the workload has no requests", file=workload.name)
    rng = np.random.default_rng([seed, 17])
    shared = _shared_ids(workload)
    order: list[int] = []
    out: list[WorkloadRequest] = []
    cycle = -1
    for _ in range(n):
        if not order:
            order = rng.permutation(len(reqs)).tolist()
            cycle += 1
        req = reqs[order.pop()]
        if cycle and req.prefix_hash_ids:
            req = req.model_copy(update={"prefix_hash_ids": [
                i if i in shared else hash((i, cycle, seed)) for i in req.prefix_hash_ids]})
        out.append(req)
    return out


def fleet_requests(workload: Workload, times: Sequence[float], *, seed: int = 0, session: str = "tenant",
                   tokens: TokenCounter | None = None, drawn: Sequence[WorkloadRequest] | None = None
                   ) -> list[FleetRequest]:
    """One `FleetRequest` per arrival time, of the requests `draw` gives (or `drawn`)."""
    if session not in SESSION_KEYS:
        raise UserError(f"unknown session key {session!r} (known: {', '.join(SESSION_KEYS)})", field="--session-key")
    tokens = tokens or RegexCounter()
    reqs = drawn if drawn is not None else draw(workload, len(times), seed)
    out: list[FleetRequest] = []
    for k, (t, req) in enumerate(zip(times, reqs)):
        n, hashes = request_shape(req, 1_000_000 + k, tokens)
        key = req.tenant if session == "tenant" else (str(hashes[0]) if session == "prefix" and hashes else None)
        out.append(FleetRequest(arrival=float(t), prompt_len=n, output_len=req.output_tokens,
                                key=RouteKey(hashes=tuple(hashes), prompt_tokens=n, block_tokens=BLOCK_SIZE,
                                             session=key, index=k)))
    return out


def _shared_ids(workload: Workload) -> set[int]:
    """Prefix ids more than one request names: the prompts' shared parts (system prompts, documents)."""
    seen: set[int] = set()
    shared: set[int] = set()
    for r in workload.requests:
        for i in set(r.prefix_hash_ids or ()):
            (shared if i in seen else seen).add(i)
    return shared


def trace_of(workload: Workload) -> list[float] | None:
    """The workload's own timestamps (sorted), or None when it has none."""
    if not workload.has_arrivals:
        return None
    return sorted(float(r.arrival_s) for r in workload.requests)  # type: ignore[arg-type]


__all__ = ["arrivals", "draw", "fleet_requests", "trace_of", "SESSION_KEYS"]
