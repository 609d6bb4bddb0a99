"""The vLLM Router's routing policies, as a model the virtual-time fleet routes with.

Each policy is one registered class (`register`, `create`, `names`), written from the router's own
source (github.com/vllm-project/router, `src/policies/*.rs`; PyPI `vllm-router` 0.1.17 ships the same
names and defaults in `vllm_router/router_args.py`). What each one reads is the router's *own* view:
its in-flight count per worker (`load`: incremented when it sends a request, decremented when the
response ends), never the engines' queues.

- `round_robin`: a counter over the healthy workers.
- `random`: a uniform draw over the healthy workers.
- `power_of_two`: two distinct random healthy workers, the one with the lower load (ties: the first).
  The router adds a load polled from the workers' `/load` every few seconds when a monitor feeds it;
  without one (the default) only its own in-flight count, as here.
- `consistent_hash`: a ring of 160 virtual nodes per worker the router lists (healthy or not: it
  rebuilds the ring only when its worker list changes); the key is the session (`X-Session-ID` header,
  the body's `user`, ...), else the request body itself. A key whose worker is unhealthy goes to the
  first healthy worker, not the next one on the ring (`consistent_hash.rs`), so one replica down sends
  all its sessions to one other. Here the session is the request's tenant or the chosen prefix key
  (`tuner.fleet.load`; the real client sends it as `X-Session-ID`), else the request's own text (unique:
  a spread like `random`). The ring hash is blake2b, not the router's FurcHash over the workers' URLs: a
  different but equally uniform placement (which sessions share a replica differs run to run).
- `cache_aware`: imbalanced when (max load - min load) > `balance_abs_threshold` (64) AND max load >
  min load x `balance_rel_threshold` (1.5): the least-loaded healthy worker (`load_imbalance`). Else the
  approximate radix tree of what each worker was sent: the deepest prefix match, and when the match rate
  (matched / prompt tokens) > `cache_threshold` (0.3, strictly), the worker that holds it
  (`prefix_hit`); else the least-loaded healthy worker (`prefix_miss`). The request is inserted under the
  chosen worker either way. The decision names are the router's own outcome labels
  (`vllm_router_prefix_routing_decisions_total`), so a real run's counts compare one to one.
  Router 0.1.17 matches on the prompt's *token ids*, which it asks each worker for (render, else
  `/tokenize`: `tuner.sim.tokenize`); without them every decision is `missing_tokens` and goes to the
  least-loaded worker, which this model does not do. Checked against the binary with stub workers that
  answer chosen token ids: text that differs over identical tokens still hits; a match of
  exactly 3 in 10 tokens misses, 4 in 10 hits; a miss goes to the least-loaded worker (ties: the first in
  the router's worker list, which is its registration order, not the command line's); of the workers
  holding the deepest match, the least loaded wins, even when another holds a shorter match above the
  threshold and is idle (ties between holders: here the one sent it last, not established). Here the tree holds
  the prompt's 16-token block hashes, so a match is counted in whole blocks (at most 15 tokens short of
  the router's). Its eviction (2^25 tokens per worker every 120 s) is not modelled: a run here sends far less.
"""

from __future__ import annotations

import abc
import bisect
import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Sequence, TypeVar

from tuner.errors import UserError

#: The router's defaults (`vllm_router/router_args.py`, 0.1.17).
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
VIRTUAL_NODES_PER_WORKER = 160
#: The `vllm serve` (0.32) flag that opens the render endpoints the router's cache_aware reads token ids
#: from; without it every cache_aware decision is `missing_tokens` (`tuner.sim.tokenize` says how this was
#: established). Real-router fleets and the export for cache_aware carry it.
SCALE_OUT_FLAG = "--enable-scale-out"


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What a policy may read of a request: its prompt's block hashes (chained: equal hash, equal
    prefix), its length in tokens, and its session key (None: the request's own text)."""

    hashes: tuple[int, ...]
    prompt_tokens: int
    block_tokens: int
    session: str | None
    index: int


class RoutingPolicy(abc.ABC):
    """One policy of the router. `select` picks a worker id among `healthy` (never empty) given the
    router's in-flight `loads` of every worker it lists; `forget` drops a worker that left the router.
    `select` is abstract: a policy registered without one fails when it is created, not mid-run."""

    name: ClassVar[str] = ""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    @abc.abstractmethod
    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        """The worker id (one of `healthy`) this request goes to."""

    def forget(self, worker: int) -> None:
        """A worker left the router (removed or scaled down)."""


P = TypeVar("P", bound=type[RoutingPolicy])
_POLICIES: dict[str, type[RoutingPolicy]] = {}


def register(name: str) -> Callable[[P], P]:
    def deco(cls: P) -> P:
        cls.name = name
        _POLICIES[name] = cls
        return cls
    return deco


def names() -> tuple[str, ...]:
    return tuple(_POLICIES)


def check_policy(name: str, field: str = "--policy") -> str:
    if name not in _POLICIES:
        raise UserError(f"unknown routing policy {name!r} (the vLLM Router's: {', '.join(names())})",
                        field=field)
    return name


def create(name: str, seed: int = 0) -> RoutingPolicy:
    return _POLICIES[check_policy(name)](seed=seed)


@register("round_robin")
class RoundRobin(RoutingPolicy):
    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.counter = 0

    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        i = self.counter % len(healthy)
        self.counter += 1
        return healthy[i]


@register("random")
class Random(RoutingPolicy):
    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        return healthy[self.rng.randrange(len(healthy))]


@register("power_of_two")
class PowerOfTwo(RoutingPolicy):
    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        if len(healthy) == 1:
            return healthy[0]
        a = self.rng.randrange(len(healthy))
        b = self.rng.randrange(len(healthy))
        while b == a:
            b = self.rng.randrange(len(healthy))
        wa, wb = healthy[a], healthy[b]
        return wa if loads.get(wa, 0) <= loads.get(wb, 0) else wb


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@register("consistent_hash")
class ConsistentHash(RoutingPolicy):
    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self._workers: tuple[int, ...] = ()
        self._ring: list[tuple[int, int]] = []

    def _rebuild(self, workers: tuple[int, ...]) -> None:
        self._workers = workers
        self._ring = sorted((_hash64(f"worker-{w}:{i}"), w) for w in workers
                            for i in range(VIRTUAL_NODES_PER_WORKER))

    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        workers = tuple(sorted(set(loads) | set(healthy)))  # the router's list: dead ones stay listed
        if workers != self._workers:  # the router rebuilds its ring when its worker list changes
            self._rebuild(workers)
        h = _hash64(f"session:{key.session}" if key.session is not None else f"request:{key.index}")
        i = bisect.bisect_left(self._ring, (h, -1))
        owner = self._ring[i % len(self._ring)][1]
        return owner if owner in healthy else healthy[0]  # an unhealthy owner: the first healthy worker

    def forget(self, worker: int) -> None:
        """A worker removed from the router's list: the ring is rebuilt without it at the next request."""


@dataclass
class _Tree:
    """The router's approximate prefix tree at block granularity: each chained block hash -> the workers
    sent a prompt through it, with when (a counter: the most recent wins a tie)."""

    nodes: dict[int, dict[int, int]] = field(default_factory=dict)
    clock: int = 0

    def match(self, hashes: Sequence[int], workers: set[int]) -> tuple[int, dict[int, int]]:
        """How many leading blocks some live worker holds, and the live workers holding the deepest
        (with when each was last sent it)."""
        owners: dict[int, int] = {}
        depth, owners = 0, {}
        for h in hashes:
            holders = self.nodes.get(h)
            live = {w: t for w, t in holders.items() if w in workers} if holders else None
            if not live:
                break
            depth, owners = depth + 1, live
        return depth, owners

    def insert(self, hashes: Sequence[int], worker: int) -> None:
        self.clock += 1
        for h in hashes:
            self.nodes.setdefault(h, {})[worker] = self.clock

    def remove(self, worker: int) -> None:
        for holders in self.nodes.values():
            holders.pop(worker, None)


@register("cache_aware")
class CacheAware(RoutingPolicy):
    def __init__(self, seed: int = 0, cache_threshold: float = CACHE_THRESHOLD,
                 balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
                 balance_rel_threshold: float = BALANCE_REL_THRESHOLD):
        super().__init__(seed)
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self.tree = _Tree()
        self.decisions = {"load_imbalance": 0, "prefix_hit": 0, "prefix_miss": 0}

    def select(self, key: RouteKey, healthy: Sequence[int], loads: dict[int, int]) -> int:
        values = list(loads.values()) or [0]
        hi, lo = max(values), min(values)
        least = min(healthy, key=lambda w: loads.get(w, 0))  # first of the least loaded, as min_by_key
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            chosen, why = least, "load_imbalance"
        else:
            depth, owners = self.tree.match(key.hashes, set(healthy))
            rate = depth * key.block_tokens / key.prompt_tokens if key.prompt_tokens else 0.0
            if owners and rate > self.cache_threshold:
                # of the workers holding the deepest match, the least loaded (ties: the one sent it last)
                chosen, why = min(owners, key=lambda w: (loads.get(w, 0), -owners[w])), "prefix_hit"
            else:
                chosen, why = least, "prefix_miss"
        self.decisions[why] += 1
        self.tree.insert(key.hashes, chosen)
        return chosen

    def forget(self, worker: int) -> None:
        self.tree.remove(worker)


__all__ = ["RouteKey", "RoutingPolicy", "register", "names", "create", "check_policy", "CACHE_THRESHOLD",
           "BALANCE_ABS_THRESHOLD", "BALANCE_REL_THRESHOLD", "SCALE_OUT_FLAG"]
