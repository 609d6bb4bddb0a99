"""The KV pool's spans (`tuner.sim.kvcache.BlockPool.land`: a request's fresh blocks as one entry) against the
block-at-a-time pool, on RAG-shaped chained prompts (the comparison of tests/unit/test_sim_kvcache_pieces.py),
with every path a span takes counted, and the one that needs a prefix evicted under a request that skipped it
set up by hand."""

from __future__ import annotations

from collections import Counter

import pytest

import tuner.sim.kvcache as kvcache
from tests.unit.test_sim_kvcache_pieces import Holder, ReferencePool, _compare, _land, _same, free_in_spans
from tuner.sim.kvcache import BlockPool


@pytest.mark.parametrize("piece,trunk,blocks,holders", [
    (4, 40, 400, 12),    # roomy: corpora and questions stay cached, taken back
    (4, 40, 150, 12),    # tight: spans evicted in part and whole, admissions refused
    (8, 24, 90, 8),      # crowded: preemptions mid-prefill, concurrent landings of one new prefix
    (64, 300, 1200, 5),  # the shipped piece size
])
def test_spans_keep_the_block_at_a_time_pool_on_rag_shaped_prompts(monkeypatch, piece, trunk, blocks, holders):
    _compare(monkeypatch, piece, trunk, blocks, holders, dup=False, rag=True)


def test_the_comparison_reaches_the_spans_every_way(monkeypatch):
    """The same for spans: made and extended by landings, freed whole, evicted in part and whole, ended by a
    reset; matched whole and in part; materialised while held (a request matching into it, or landing on it:
    the same new prefix computed at once) and while free, found by a landing in its chunk. (A landing finding
    one behind its chunk, and a match going on past one, need a prefix evicted under a request that skipped
    it: the next test sets that up.)"""
    seen: Counter[str] = Counter()
    context: list[str] = []

    def wrap(name, note, during=None):
        orig = getattr(BlockPool, name)

        def wrapped(pool, *args):
            before = (set(pool.spans), free_in_spans(pool), [s[4] for s in args[-1] or ()] if name == "land" else None)
            if during:
                context.append(during)
            try:
                out = orig(pool, *args)
            finally:
                if during:
                    context.pop()
            note(pool, before, args, out)
            return out
        monkeypatch.setattr(BlockPool, name, wrapped)

    def on_land(pool, before, args, out):
        seen["span made"] += bool(set(pool.spans) - before[0])
        seen["span extended"] += any(s[4] > stop for s, stop in zip(out or (), before[2]))

    def on_materialise(pool, before, args, out):
        seen[f"materialised {'free' if before[1] > free_in_spans(pool) else 'held'} by {context[-1]}"] += 1

    def on_reached(pool, before, args, out):
        ended = before[0] - set(pool.spans)
        seen["found in the chunk"] += bool(ended & set(args[2]))
        seen["found behind the chunk"] += bool(ended - set(args[2]))

    def on_match(pool, before, args, out):
        hashes, n = args[0], out[0]
        for p, h in enumerate(hashes[:n]):
            span = pool.spans.get(h)
            if span is not None:
                size = span[4] - span[3]
                seen["matched whole" if n >= p + size else "matched in part"] += 1
                seen["matched past a span"] += n > p + size

    def on_release(pool, before, args, out):
        seen["freed whole"] += free_in_spans(pool) > before[1]

    def on_evict(pool, before, args, out):
        span = args[0]
        if span[0] == kvcache.SPAN:
            seen["ended by a reset" if context[-1:] == ["reset"] else
                 "evicted in part" if span[2] is not None else "evicted whole"] += 1

    wrap("land", on_land)
    wrap("_materialise_reached", on_reached, "landing")
    wrap("ref", lambda *a: None, "matching")
    wrap("_materialise", on_materialise)
    wrap("match", on_match)
    wrap("release", on_release)
    wrap("_evict_whole", on_evict)
    wrap("reset_prefix_cache", lambda *a: None, "reset")
    for piece, trunk, blocks, holders in [(4, 40, 150, 12), (8, 24, 90, 8)]:
        _compare(monkeypatch, piece, trunk, blocks, holders, dup=False, rag=True)
    assert set(seen) >= {"span made", "span extended", "freed whole", "evicted in part", "evicted whole",
                         "ended by a reset", "matched whole", "matched in part", "materialised held by matching",
                         "materialised free by matching", "materialised held by landing", "found in the chunk"}, seen
    assert all(seen[k] for k in seen if k not in ("found behind the chunk", "matched past a span")), seen


def test_a_span_over_blocks_a_request_skipped_is_found_behind_its_chunk(monkeypatch):
    """Y and Z compute the same new prompt at once: Z skips the blocks Y registered first. Y finishes, those
    blocks are evicted, and O computes them again as a span: Z's next chunk lies in that span, though its
    first block is not in the chunk. And a match goes on past a span into blocks held one by one."""
    monkeypatch.setattr(kvcache, "MIN_SPAN", 1)
    prompt = list(range(101, 111))
    fast, ref = BlockPool(40, piece=64), ReferencePool(40)
    holders: dict[str, tuple[Holder, Holder]] = {}

    def admit(name):
        hf, hr = holders[name] = Holder(prompt), Holder(prompt)
        for pool, h in ((fast, hf), (ref, hr)):
            n, from_free = pool.match(prompt, len(prompt))
            h.held, h.computed = prompt[:n], n
            h.pieces = pool.ref(h.held, from_free)
            assert pool.take(len(prompt) - n)
            h.n_blocks = len(prompt)

    def land(name, hi):
        for pool, h in zip((fast, ref), holders[name]):
            _land(pool, h, hi)
        _same(fast, ref)

    def evict(k):  # k cached blocks evicted (by a request that takes every free block, then gives them back)
        for pool in (fast, ref):
            n = pool.free_anon + k
            assert pool.take(n)
            pool.release([], n)
        _same(fast, ref)

    def release(name):
        hf, hr = holders.pop(name)
        fast.release(hf.held, hf.n_blocks - len(hf.held), hf.pieces, hf.spans)
        ref.release(hr.held, hr.n_blocks - len(hr.held))
        _same(fast, ref)

    admit("Y")
    admit("Z")
    land("Y", 10)  # Y's span
    land("Z", 5)   # Z lands on it: materialised, Z skips blocks 0..4
    release("Y")
    evict(10)  # all of Y's blocks
    admit("O")
    land("O", 10)  # O's span over them
    assert prompt[0] in fast.spans
    land("Z", 10)  # Z's chunk 5..9 lies in O's span, found from block 4 back
    assert not fast.spans and holders["Z"][0].held == []
    release("O")
    release("Z")
    fast.reset_prefix_cache()
    ref.reset_prefix_cache()
    admit("Y")
    admit("Z")
    land("Y", 5)   # Y's span 0..4
    land("Z", 10)  # Z skips 0..4 (materialised), registers 5..9 one by one
    release("Y")
    evict(5)
    admit("O")
    land("O", 5)   # O's span 0..4, then 5..9 are Z's
    land("O", 10)
    assert prompt[0] in fast.spans
    assert fast.match(prompt, 10) == ref.match(prompt, 10) == (10, 0)  # past O's span into Z's blocks
