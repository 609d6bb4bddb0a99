"""The KV pool's held pieces and run-wise LRU (`tuner.sim.kvcache.BlockPool`) against the block-at-a-time pool
they replaced: the same blocks in use, the same free-but-cached blocks in the same LRU order, the same
prefix matches and free counts after every operation, and the same load runs through the engine."""

from __future__ import annotations

import random
import sys
from collections import Counter, OrderedDict

import pytest

import tuner.sim.engine as engine_mod
import tuner.sim.kvcache as kvcache
import tuner.sim.lru as lru
from tuner.engine.virtual import SimRequest, run_virtual
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.kvcache import BlockPool
from tuner.tokens import block_hashes_from_ids


class ReferencePool:
    """vLLM's prefix-caching pool one block at a time: a reference count per block, one OrderedDict LRU."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.caching = enable_caching
        self.free_anon = num_blocks
        self.cached_free: OrderedDict[int, None] = OrderedDict()
        self.cached_used: dict[int, int] = {}
        self.free_whole = 0  # the engine reads it with the free list's length

    @property
    def num_free(self) -> int:
        return self.free_anon + len(self.cached_free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    def match(self, hashes, max_blocks):
        if not self.caching or max_blocks <= 0:
            return 0, 0
        n = from_free = 0
        for h in hashes[:max_blocks]:
            if h in self.cached_used:
                n += 1
            elif h in self.cached_free:
                n += 1
                from_free += 1
            else:
                break
        return n, from_free

    def ref(self, hashes, from_free=None):
        for h in hashes:
            self.cached_free.pop(h, None)
            self.cached_used[h] = self.cached_used.get(h, 0) + 1
        return 0

    def take(self, n):
        if n > self.num_free:
            return False
        anon = min(n, self.free_anon)
        self.free_anon -= anon
        for _ in range(n - anon):
            self.cached_free.popitem(last=False)
        return True

    def land(self, held, hashes, lo, hi, spans):
        for h in hashes[lo:hi]:
            if h not in self.cached_used and h not in self.cached_free:
                self.cached_used[h] = 1
                held.append(h)
        return spans

    def release(self, hashes, n_anon, pieces=0, spans=None):
        for h in reversed(hashes):
            c = self.cached_used[h] - 1
            if c:
                self.cached_used[h] = c
            else:
                del self.cached_used[h]
                self.cached_free[h] = None
        self.free_anon += n_anon

    def reset_prefix_cache(self):
        self.free_anon += len(self.cached_free)
        self.cached_free.clear()

    def lru_order(self):
        return list(self.cached_free)


class Holder:
    """A request's view of one pool: its prompt's hashes, the blocks it holds, as the engine keeps them."""

    def __init__(self, hashes):
        self.hashes, self.held, self.pieces, self.spans, self.n_blocks, self.landed = hashes, [], None, None, 0, False
        self.computed = 0  # blocks computed (landed) or matched


def _chains(rng: random.Random, trunk: int, n: int, dup: bool) -> list[list[int]]:
    """Prompts sharing a trunk's prefix (cut at random lengths), with private tails; `dup`: a few hashes
    listed twice in a prompt, and pieces whose last hash is another piece's (what a collision would do)."""
    base = [rng.getrandbits(60) for _ in range(trunk)]
    out = []
    for i in range(n):
        cut = rng.choice([trunk, trunk, trunk, rng.randint(0, trunk)])
        tail = [rng.getrandbits(60) for _ in range(rng.randint(0, 3 * trunk // 4))]
        h = base[:cut] + tail
        if dup and h and rng.random() < 0.3:
            j = rng.randrange(len(h))
            h.insert(rng.randrange(j, len(h) + 1), h[j])  # the same hash twice in one prompt
        if dup and len(h) > 8 and rng.random() < 0.2:
            h[rng.randrange(len(h))] = base[min(len(base) - 1, rng.randrange(trunk))] if base else 1
        out.append(h)
    if dup:  # prompts that only agree past their first blocks
        out += [[rng.getrandbits(60)] + base[1:] for _ in range(3)]
    return out


def _rag_chains(rng: random.Random, trunk: int, n: int) -> list[list[int]]:
    """RAG-shaped chained prompts: two corpora (shared prefixes, cut at random lengths now and then), each
    prompt with a private question past it; the same prompt listed again now and then (a repeated question)."""
    corpora = [[rng.getrandbits(60) for _ in range(trunk)] for _ in range(2)]
    out = []
    for _ in range(n):
        corpus = rng.choice(corpora)
        cut = rng.choice([trunk, trunk, rng.randint(0, trunk)])
        out.append(corpus[:cut] + [rng.getrandbits(60) for _ in range(rng.randint(trunk // 4, trunk))])
    return out + rng.sample(out, n // 4)


def _land(pool, h: Holder, hi: int | None = None) -> None:
    """The engine's chunk landing (`EngineCore._land_chunk`): the prompt's blocks up to `hi` (all: None)
    computed, the uncached ones registered."""
    lo, hi = max(h.computed, len(h.held)), len(h.hashes) if hi is None else hi
    if hi > lo:
        h.spans = pool.land(h.held, h.hashes, lo, hi, h.spans)
    h.computed = max(h.computed, hi)
    h.landed = h.computed >= len(h.hashes)


def _held_in_spans(pool) -> dict[int, int]:
    """The blocks of held spans, one reference each (their owner's), checking each span's entry."""
    out: dict[int, int] = {}
    for head, (mark, blocks, run, start, stop) in getattr(pool, "spans", {}).items():
        assert mark == kvcache.SPAN and start < stop and blocks[start] == head
        if run is None:
            out.update(dict.fromkeys(blocks[start:stop], 1))
        else:
            assert run[4] is pool.spans[head] and run[1] is None
    return out


def free_in_pieces(pool: BlockPool) -> int:
    """Blocks in the pool's free pieces (counted from the pieces themselves)."""
    return sum(len(e[1]) for e in pool.pieces.values() if not e[0])


def free_in_spans(pool: BlockPool) -> int:
    """Blocks in the pool's free spans (counted from the spans themselves)."""
    return sum(s[4] - s[3] for s in pool.spans.values() if s[2] is not None)


def _same(fast: BlockPool, ref: ReferencePool) -> None:
    assert fast.lru_order() == ref.lru_order()
    assert (fast.free_anon, fast.num_free) == (ref.free_anon, ref.num_free)
    in_spans = _held_in_spans(fast)
    assert not set(in_spans) & set(fast.cached_used) and not set(in_spans) & set(fast.cached_free)
    # a block's count: its own references plus one if a piece (held, or free: then it is free) contains it
    expected = dict(ref.cached_used)
    for key, (holders, blocks, run, dirty) in fast.pieces.items():
        assert blocks[-1] == key and (run is None) == (holders > 0)
        for b in blocks:
            assert fast.in_piece[b] == key
            expected[b] = expected[b] - (holders - 1) if holders else 1
        assert dirty or {expected[b] for b in blocks} == {1}  # not dirty: no block referenced on its own
    assert {**fast.cached_used, **in_spans} == expected
    assert len(fast.in_piece) == sum(len(e[1]) for e in fast.pieces.values())
    assert fast.free_whole == free_in_pieces(fast) + free_in_spans(fast)
    assert not set(fast.cached_free) & set(fast.cached_used)


@pytest.mark.parametrize("piece,trunk,blocks,holders,dup", [
    (4, 40, 400, 12, False),     # many holders of a shared trunk, roomy pool
    (4, 40, 120, 12, False),     # tight: evictions, admissions refused
    (8, 30, 90, 6, True),        # hashes listed twice, colliding piece keys
    (64, 300, 900, 5, False),    # the shipped piece size, RAG-like prompts
    (3, 10, 40, 20, True),       # tiny pieces, a crowded small pool
])
def test_pieces_and_runs_keep_the_block_at_a_time_pool(monkeypatch, piece, trunk, blocks, holders, dup):
    _compare(monkeypatch, piece, trunk, blocks, holders, dup)


def _compare(monkeypatch, piece: int, trunk: int, blocks: int, holders: int, dup: bool, rag: bool = False) -> None:
    """Random admissions, landings (whole, or in chunks), decodes, releases and resets on both pools, compared
    after each. Hash lists with a hash listed twice (`dup`) are not chained: that pool makes no spans."""
    for seed in range(4):
        monkeypatch.setattr(lru, "LRU_SLACK", 65536 if seed % 2 else 0)  # odd seeds: compacted often
        rng = random.Random(seed)
        monkeypatch.setattr(kvcache, "MIN_SPAN", rng.choice([1, 3, piece]))
        fast, ref = BlockPool(blocks, piece=piece, chained=not dup), ReferencePool(blocks)
        chains = _rag_chains(rng, trunk, 25) if rag else _chains(rng, trunk, 25, dup)
        live: list[tuple[Holder, Holder]] = []
        for _ in range(600):
            op = rng.random()
            if op < 0.35 and len(live) < holders:  # admit: match, reference the hit, take the rest
                hashes = rng.choice(chains)
                hf, hr = Holder(hashes), Holder(hashes)
                limit = rng.choice([len(hashes), max(0, len(hashes) - 1), len(hashes) + 5])
                m = fast.match(hashes, limit)
                assert m == ref.match(hashes, limit)
                need = len(hashes) - m[0] + rng.randint(0, 3)
                if need + m[1] > ref.num_free:
                    continue
                hf.held, hr.held = hashes[:m[0]], hashes[:m[0]]
                hf.pieces = fast.ref(hf.held, m[1] if rng.random() < 0.5 else None)
                ref.ref(hr.held, m[1])
                assert fast.take(need) and ref.take(need)
                hf.n_blocks = hr.n_blocks = m[0] + need
                hf.computed = hr.computed = m[0]
                live.append((hf, hr))
            elif op < 0.55 and live:  # land a prefill: its fresh blocks registered
                hf, hr = rng.choice(live)
                if not hf.landed:
                    hi = rng.choice([None, min(len(hf.hashes), hf.computed + rng.randint(1, 2 * piece))])
                    _land(fast, hf, hi)
                    _land(ref, hr, hi)
                    assert hf.held == hr.held
            elif op < 0.65 and live:  # a decode grows: one block more (or a refused one)
                hf, hr = rng.choice(live)
                k = rng.randint(1, 4)
                ok = fast.take(k)
                assert ok == ref.take(k)
                if ok:
                    hf.n_blocks += k
                    hr.n_blocks += k
            elif op < 0.97 and live:  # finish or be preempted: everything back
                hf, hr = live.pop(rng.randrange(len(live)))
                fast.release(hf.held, hf.n_blocks - len(hf.held), hf.pieces, hf.spans)
                ref.release(hr.held, hr.n_blocks - len(hr.held))
            elif op >= 0.97:
                fast.reset_prefix_cache()
                ref.reset_prefix_cache()
            _same(fast, ref)
        for hf, hr in live:
            fast.release(hf.held, hf.n_blocks - len(hf.held), hf.pieces, hf.spans)
            ref.release(hr.held, hr.n_blocks - len(hr.held))
        _same(fast, ref)
        assert fast.num_free == blocks and not any(e[0] for e in fast.pieces.values())  # free pieces may stay
        assert set(fast.cached_used) == set(fast.in_piece)


def test_the_comparison_reaches_the_free_pieces_every_way(monkeypatch):
    """The comparison above is only as good as the paths it takes: free pieces taken back whole, evicted
    whole and in part, parted by a request that takes some of their blocks alone (after `match` counted
    those among the free ones), pieces whose last holder finds a block still referenced alone, windows
    that cannot be pieces."""
    seen: Counter[str] = Counter()

    def wrap(name, note):
        orig = getattr(BlockPool, name)

        def wrapped(pool, *args):
            before = (free_in_pieces(pool), len(pool.in_piece), seen["parted"])
            out = orig(pool, *args)
            note(pool, before, args, out)
            return out
        monkeypatch.setattr(BlockPool, name, wrapped)

    def on_unpiece(pool, before, args, out):
        e, evict = args
        seen["parted" if not evict else "evicted in part" if evict < len(e[1]) else "evicted whole"] += 1

    def on_ref(pool, before, args, out):
        seen["taken back whole"] += before[0] > free_in_pieces(pool) and seen["parted"] == before[2]

    def on_match_blocks(pool, before, args, out):
        seg, (k, from_free) = args[0], out
        seen["matched alone while free"] += from_free > sum(h in pool.cached_free for h in seg[:k])

    wrap("_unpiece", on_unpiece)
    wrap("ref", on_ref)
    wrap("_match_blocks", on_match_blocks)
    wrap("release", lambda pool, before, args, out: seen.update({"last holder finds one alone":
                                                                  len(pool.in_piece) < before[1]}))
    wrap("_new_piece", lambda pool, before, args, out: seen.update({"no piece": out is None}))
    land = _land

    def landing(pool, h, hi=None):  # a prompt's block past its match that lies in a free piece: cached, not registered
        if isinstance(pool, BlockPool):
            seen["registered in a free piece"] += any(not pool.pieces[pool.in_piece[b]][0]
                                                      for b in h.hashes[len(h.held):hi] if b in pool.in_piece)
        land(pool, h, hi)
    monkeypatch.setattr(sys.modules[__name__], "_land", landing)
    for piece, trunk, blocks, holders, dup in [(4, 40, 120, 12, False), (8, 30, 90, 6, True)]:
        _compare(monkeypatch, piece, trunk, blocks, holders, dup)
    assert set(seen) >= {"parted", "evicted in part", "evicted whole", "taken back whole", "no piece",
                         "matched alone while free", "last holder finds one alone", "registered in a free piece"}, seen
    assert all(seen.values()), seen


def test_the_lru_stays_bounded_when_blocks_are_taken_back_and_freed_again():
    pool = BlockPool(10_000, piece=4)
    hashes = list(range(1, 201))
    for _ in range(500):  # the same prompt admitted and finished again and again: no eviction ever
        n, ff = pool.match(hashes, len(hashes))
        held = hashes[:n]
        pieces = pool.ref(held, ff)
        pool.take(len(hashes) - n)
        h = Holder(hashes)
        h.held = held
        _land(pool, h)
        pool.release(h.held, len(hashes) - len(h.held), pieces, h.spans)
    assert pool.lru_order() == hashes[::-1]
    assert pool.free.entries <= 4 * len(pool.cached_free) + lru.LRU_SLACK


def _rag_requests(n: int, rate: float, seed: int) -> list[SimRequest]:
    """RAG-like prompts: one shared corpus (ids of 256 tokens), a private question, arrivals at `rate`."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        corpus = rng.choice([30, 30, 30, 12])
        p = corpus * 256 + rng.randint(100, 3000)
        ids = list(range(100_000, 100_000 + corpus)) + [10_000_000 + 10 * i + k for k in range(3)]
        out.append(SimRequest(t, p, rng.randint(20, 300), block_hashes_from_ids(ids, 256, p, unique=i)))
    return out


def _dump(run) -> tuple:
    pool = run.engine.pool
    in_use = [h for h in pool.cached_used if not _in_free_piece(pool, h)] + list(_held_in_spans(pool))
    return ([r.model_dump() for r in run.records], run.metrics.model_dump(), run.duration_s, run.steps,
            sorted(in_use), pool.lru_order(), pool.free_anon, pool.num_free)


def _in_free_piece(pool, h: int) -> bool:
    key = getattr(pool, "in_piece", {}).get(h)
    return key is not None and not pool.pieces[key][0]


@pytest.mark.parametrize("knobs,rate", [
    (Knobs(max_model_len=16384), 4.0),                                        # roomy: the corpus stays cached
    (Knobs(max_model_len=16384, gpu_memory_utilization=0.25), 6.0),           # KV-bound: evictions, preemptions
    (Knobs(max_model_len=16384, max_num_batched_tokens=2048, gpu_memory_utilization=0.3), 8.0),  # chunks
    (Knobs(max_model_len=16384, enable_prefix_caching=False, gpu_memory_utilization=0.3), 4.0),
])
def test_load_runs_are_the_block_at_a_time_pools(monkeypatch, knobs, rate):
    cfg = resolve(get_gpu("h100"), get_model("llama-3.1-8b"), knobs)
    reqs = _rag_requests(150, rate, seed=5)
    kw = dict(request_timeout_s=60.0, sample_interval_s=0.05)
    fast = _dump(run_virtual(cfg, reqs, **kw))
    monkeypatch.setattr(engine_mod, "BlockPool", ReferencePool)
    reference = _dump(run_virtual(cfg, reqs, **kw))
    assert fast == reference
    assert fast[1]["counters"]["request_success"] > 0
