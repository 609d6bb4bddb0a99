"""The paged KV pool with vLLM's automatic prefix caching.

Blocks are counted, not materialised: a block is either free and anonymous, free but still holding a
cached prefix (evictable, in LRU order), or in use. A full prompt block is registered under its chained
hash once computed; when its last user finishes it becomes free-but-cached, and a later request with the
same prefix takes it back instead of recomputing it. Allocation takes anonymous blocks first, then evicts
the least recently freed cached block.

A 32k-token prompt is 2,000 blocks, nine in ten of them (on the RAG space) a prefix other requests hold
too: a reference more or less on each, a block at a time, was most of the twin's ranking time. So a
matched prefix is held in *pieces* of `PIECE` aligned blocks: a piece others hold takes one reference
(after comparing its blocks, for a shared prefix the same objects), not one a block. A piece outlives its
holders: when the last one finishes and no block of it is referenced on its own, it goes to the LRU whole
(a *free piece*, its blocks where the block-at-a-time pool frees them, tail first) and the next request
of its corpus takes it back whole; it turns back into blocks only where that pool would part them
(eviction reaching it part-way, a request taking some of its blocks alone). `cached_used[h]` counts a
block's own references plus one if it lies in a piece, held or free, so a piece's blocks are untouched
when it is freed or taken back; `in_piece` finds a block's piece where a prefix is matched block by block.

What is left, a RAG prompt's ~100 private blocks past its corpus, no other request holds: the blocks a
request computes in a chunk right after its own are one *span* (its hashes in its `held` list, in no
dict), registered, freed (to the LRU whole, tail first) and evicted (by shortening it) as one entry.
Spans need chained hash lists (vLLM's rule: a block's hash includes its parent's, so two prompts share
block k only if they share blocks 0..k): another prompt enters a span only by its first block, which
`spans` indexes, and a span starts at a prompt's start or after a block in a dict, which stays cached
while the span is (freed after it, evicted after it). A lookup that finds a span *materialises* it, its
blocks put into the dicts as the block-at-a-time pool has them (another request matching into it, or
computing the same blocks at once). Every cached block is in `cached_used`, `cached_free`, a free piece
or a span. tests/unit/test_sim_kvcache_pieces.py and ..._spans.py keep the pool in step with the
block-at-a-time one. What is still done per block runs in C (`takewhile`, `map`, `compress`,
`_count_elements`), lazily where a hash listed twice must be handled as the one-at-a-time loop would;
short lists (a chat prompt's) in plain loops, where C passes cost more than they save.
"""

from __future__ import annotations

from collections import _count_elements  # type: ignore[attr-defined]
from itertools import compress, filterfalse, islice, repeat, takewhile
from operator import eq, not_
from typing import Sequence

from tuner.sim.lru import SHORT, FreeList, consume

#: Blocks in one piece of a held prefix (1,024 tokens at vLLM's 16-token blocks): a RAG prompt's shared
#: corpus is twenty-odd pieces; what is left past a prompt's last whole piece is held block by block.
PIECE = 64
#: A request's freshly computed blocks, this many or more in one chunk, are registered as one span (fewer,
#: a chat prompt's, block by block: another turn soon takes them back).
MIN_SPAN = 32
#: A span's entry starts with this (a piece's starts with its holders, never negative).
SPAN = -1


class BlockPool:
    __slots__ = ("num_blocks", "caching", "free_anon", "free", "cached_free", "cached_used", "pieces", "piece",
                 "in_piece", "free_whole", "spans", "chained")

    def __init__(self, num_blocks: int, enable_caching: bool = True, piece: int = PIECE, chained: bool = True):
        self.num_blocks = num_blocks
        self.caching = enable_caching
        self.free_anon = num_blocks
        #: the free-but-cached blocks in LRU order; `cached_free`: those outside free pieces and spans
        self.free = FreeList(self._evict_whole, self._whole_order)
        self.cached_free = self.free.blocks
        self.cached_used: dict[int, int] = {}
        #: pieces, by their last block's hash: [holders, the piece's blocks, its LRU run while free (0 holders),
        #: 1 where a block of it may be referenced on its own too (its last holder then looks)]
        self.pieces: dict[int, list] = {}
        self.in_piece: dict[int, int] = {}  # a piece's block -> the piece's key
        #: blocks kept whole while free: in free pieces and free spans (free, cached, outside `cached_free`)
        self.free_whole = 0
        self.piece = piece
        #: spans, by their first block's hash: [SPAN, the owner's held list, its LRU run while free (None while
        #: held), start, stop]: the span's blocks are held[start:stop] (start == stop: it was materialised).
        self.spans: dict[int, list] = {}
        self.chained = chained  # the hash lists are chained (vLLM's rule): without it, no spans

    @property
    def num_free(self) -> int:
        return self.free_anon + len(self.cached_free) + self.free_whole

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: the fraction of blocks in use (free cached blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def match(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """Length of the cached prefix of `hashes` (at most `max_blocks`), and how many of those blocks
        sit in the free list (taking them reduces the free count). Aligned windows of `piece` blocks
        that are pieces count whole; the others block by block. Where the blocks stop, a span may go on:
        entered by its first block (the hashes are chained), it counts as far as it agrees."""
        if not self.caching or max_blocks <= 0:
            return 0, 0
        end = min(max_blocks, len(hashes))
        n, from_free = self._match_from(hashes, 0, end)
        spans = self.spans
        while spans and n < end:
            s = spans.get(hashes[n])
            if s is None:
                break
            blocks, run, start, stop = s[1], s[2], s[3], s[4]
            k = len(list(takewhile(bool, map(eq, islice(hashes, n, end), islice(blocks, start, stop)))))
            n += k
            if run is not None:
                from_free += k
            if k < stop - start or n == end:
                break
            k, f = self._match_from(hashes, n, end)
            n += k
            from_free += f
        return n, from_free

    def _match_from(self, hashes: Sequence[int], n: int, end: int) -> tuple[int, int]:
        """`match` from block `n` to the first block cached in no dict: pieces whole, the rest block by block."""
        pieces, W = self.pieces, self.piece
        if end - n < W or not pieces:
            return self._match_blocks(hashes[n:end])
        start, from_free = n, 0
        while n < end:
            if n + W <= end:
                seg = hashes[n:n + W]
                e = pieces.get(seg[-1])
                if e is not None and e[1] == seg:  # the same objects for a shared prefix: a pointer compare
                    if not e[0]:
                        from_free += W
                    n += W
                    continue
            else:
                seg = hashes[n:end]
            k, f = self._match_blocks(seg)
            n += k
            from_free += f
            if k < len(seg):
                break
        return n - start, from_free

    def _match_blocks(self, seg: list[int]) -> tuple[int, int]:
        """`match` block by block: in-use and free-but-cached runs, to the first miss, in C."""
        used, free = self.cached_used, self.cached_free
        k = len(list(takewhile(used.__contains__, seg)))
        from_free = 0
        while k < len(seg):
            f = len(list(takewhile(free.__contains__, islice(seg, k, None))))
            if not f:
                break
            from_free += f
            k += f
            k += len(list(takewhile(used.__contains__, islice(seg, k, None))))
        if k and self.free_whole and self.in_piece:  # a free piece's blocks sit in `used` too
            keys = set(map(self.in_piece.get, seg[:k]))
            free_keys = {key for key in keys if key is not None and not self.pieces[key][0]}
            from_free += sum(map(free_keys.__contains__, map(self.in_piece.get, seg[:k]))) if free_keys else 0
        return k, from_free

    def ref(self, hashes: Sequence[int], from_free: int | None = None) -> list:
        """Take a reference on the cached blocks `hashes` found by `match` (`from_free`: how many of them
        sit in the free list, as `match` said; 0 skips looking there). Returns the pieces the caller now
        holds, one an aligned window (None: held block by block): pass it back to `release`."""
        used, pieces, W = self.cached_used, self.pieces, self.piece
        n = len(hashes)
        held: list = []
        whole_free = 0
        rest: list[int] = [] if n >= W else list(hashes)  # the blocks held one by one
        for p in range(0, n - W + 1, W):  # pieces: one reference more on each (a free one is taken back)
            seg = hashes[p:p + W]
            e = pieces.get(seg[-1])
            if e is not None and e[1] == seg:
                if not e[0]:
                    e[2] = None
                    whole_free += W
                e[0] += 1
                held.append(e)
            else:
                held.append(None)
                rest += seg
        if whole_free:
            self.free_whole -= whole_free
        if n >= W and n > len(held) * W:
            rest += hashes[len(held) * W:]
        if not rest:
            return held
        if self.spans:  # spans it matched into (by their first block: the hashes are chained): in blocks now
            for h in list(filter(self.spans.__contains__, rest)):
                self._materialise(self.spans[h])
        if self.in_piece:  # pieces some of whose blocks are referenced on their own
            keys = set(map(self.in_piece.get, rest))
            keys.discard(None)
            for key in keys:
                e = pieces[key]
                if e[0]:
                    e[3] = 1  # its last holder looks for them
                else:  # a free one: in blocks, where the one-at-a-time pool has them
                    self._unpiece(e, 0)
                    from_free = None
        if from_free is None or from_free > whole_free:
            self.free.take_back(rest)
        _count_elements(used, rest)  # used[h] = used.get(h, 0) + 1 for each, in C
        for j, e in enumerate(held):  # windows held block by block: pieces from now on, where they can be
            if e is None:
                seg = hashes[j * W:(j + 1) * W]
                held[j] = self._new_piece(seg)
        return held

    def _new_piece(self, seg: list[int]) -> list | None:
        """A window of blocks (each just counted once more in `used`: the piece's reference) as a piece
        held once; None where it cannot be one (its key taken, a block in another piece or listed twice)."""
        key, in_piece = seg[-1], self.in_piece
        if key in self.pieces or any(map(in_piece.__contains__, seg)):
            return None
        before = len(in_piece)
        in_piece.update(zip(seg, repeat(key)))
        if len(in_piece) - before < len(seg):  # a block listed twice
            consume(map(in_piece.pop, seg, repeat(None)))
            return None
        e = self.pieces[key] = [1, seg, None, 1]
        return e

    def _unpiece(self, e: list, evict: int) -> None:
        """Free piece `e` ends: its last `evict` blocks are evicted, the others stay free one by one in
        its run's place, last first (where the block-at-a-time pool has them)."""
        blocks, run = e[1], e[2]
        W = len(blocks)
        del self.pieces[blocks[-1]]
        consume(map(self.in_piece.__delitem__, blocks))
        consume(map(self.cached_used.__delitem__, blocks))
        self.free_whole -= W
        e[2] = None
        self.free.unfold(run, blocks[W - evict - 1::-1] if evict < W else [])

    def take(self, n: int) -> bool:
        """Allocate `n` fresh blocks, evicting cached ones if needed. False (and nothing taken) if short."""
        if n <= self.free_anon:
            self.free_anon -= n
            return True
        if n > self.free_anon + len(self.cached_free) + self.free_whole:  # num_free
            return False
        self.free.evict(n - self.free_anon)
        self.free_anon = 0
        return True

    def _evict_whole(self, e: list, n: int) -> int:
        """The free list evicts up to `n` blocks of free piece or span `e`, last first: how many it did."""
        if e[0] != SPAN:
            n = min(n, len(e[1]))
            self._unpiece(e, n)  # the rest of it now blocks of its run
            return n
        size = e[4] - e[3]
        if n < size:
            e[4] -= n
        else:
            n = size
            del self.spans[e[1][e[3]]]
            e[2] = None
            e[3] = e[4]
        self.free_whole -= n
        return n

    def _whole_order(self, e: list) -> list[int]:
        """A free piece's or span's blocks, least recently freed (last) first."""
        return e[1][e[3]:e[4]][::-1] if e[0] == SPAN else e[1][::-1]

    def lru_order(self) -> list[int]:
        """The free-but-cached blocks, least recently freed first (the order eviction takes them)."""
        return self.free.order()

    def land(self, held: list[int], hashes: list[int], lo: int, hi: int, spans: list | None) -> list | None:
        """Prompt blocks `lo`..`hi` - 1 of `hashes` were just computed: those not cached yet are registered
        and appended to `held`; another request's blocks stay where they are (this one's copies anonymous).
        A chunk of fresh blocks right after the request's own (`lo == len(held)`) is a span: one entry, not
        one a block; it extends the request's open span. Returns the request's spans (`spans`, or a new list)."""
        chunk = hashes[lo:hi]
        used, free, by_head = self.cached_used, self.cached_free, self.spans
        fresh = list(filterfalse(free.__contains__, filterfalse(used.__contains__, chunk)))
        after_own = lo == len(held)
        if by_head and (len(fresh) < len(chunk) or not after_own or chunk[0] in by_head):
            if self._materialise_reached(hashes, lo, chunk, after_own):
                fresh = list(filterfalse(free.__contains__, filterfalse(used.__contains__, chunk)))
        if after_own and len(fresh) == len(chunk) and self.chained:
            last = spans[-1] if spans else None
            if last is not None and last[3] < last[4] == lo:
                last[4] = hi
                held += chunk
                return spans
            if len(chunk) >= MIN_SPAN:
                by_head[chunk[0]] = span = [SPAN, held, None, lo, hi]
                held += chunk
                return (spans or []) + [span]
        registered = dict.fromkeys(fresh, 1)
        used.update(registered)
        held.extend(registered)
        return spans

    def _materialise_reached(self, hashes: list[int], lo: int, chunk: list[int], after_own: bool) -> bool:
        """Materialise the spans that blocks of `chunk` lie in: a span in the chunk starts there (the hashes
        are chained, and a span's first block follows a block in a dict while it is cached), or runs into
        it from blocks before it that the request does not hold (`after_own` false). Whether any was."""
        by_head, found = self.spans, False
        for h in list(filter(by_head.__contains__, chunk)):
            self._materialise(by_head[h])
            found = True
        if not after_own:  # back to the nearest block in a dict, or a span's first block
            used, free = self.cached_used, self.cached_free
            k = lo - 1
            while k >= 0 and hashes[k] not in used and hashes[k] not in free and hashes[k] not in by_head:
                k -= 1
            if k >= 0 and hashes[k] in by_head:
                self._materialise(by_head[hashes[k]])
                found = True
        return found

    def _materialise(self, span: list) -> None:
        """Span `span` ends: its blocks go into the dicts as the block-at-a-time pool has them (held: one
        reference each, its owner's; free: last first, in its run's place)."""
        blocks, run, start, stop = span[1], span[2], span[3], span[4]
        seg = blocks[start:stop]
        del self.spans[seg[0]]
        span[3] = stop
        if run is None:
            self.cached_used.update(zip(seg, repeat(1)))
            return
        span[2] = None
        self.free.unfold(run, seg[::-1])
        self.free_whole -= len(seg)

    def release(self, hashes: Sequence[int], n_anon: int, pieces: list | None = None,
                spans: list | None = None) -> None:
        """Free a request's blocks (`pieces`: as `ref` returned, `spans`: as `land` did): cached ones go to
        the LRU tail in reverse order (so a prompt's tail blocks are evicted before its head, as in vLLM),
        anonymous ones back to the free count. A span goes whole, as one entry."""
        self.free_anon += n_anon
        hi = len(hashes)
        for span in reversed(spans or ()):
            start, stop = span[3], span[4]
            if start == stop:
                continue  # materialised: its blocks are held one by one
            if hi > stop:
                self._drop(hashes[stop:hi][::-1])
            span[2] = self.free.append_whole(span)
            self.free_whole += stop - start
            hi = start
        if not pieces:
            if hi:
                self._drop(hashes[hi - 1::-1])
            return
        W = self.piece
        for j in range(len(pieces) - 1, -1, -1):
            e = pieces[j]
            if e is None:
                continue
            if hi > (j + 1) * W:  # the blocks past this piece held one by one, last first
                self._drop(hashes[hi - 1:(j + 1) * W - 1:-1])
            hi = j * W
            e[0] -= 1
            if e[0]:
                continue
            blocks = e[1]  # its last holder: free whole unless a block is referenced on its own too
            if not e[3] or max(map(self.cached_used.__getitem__, blocks)) == 1:
                e[3] = 0
                e[2] = self.free.append_whole(e)
                self.free_whole += len(blocks)
            else:
                del self.pieces[blocks[-1]]
                consume(map(self.in_piece.__delitem__, blocks))
                self._drop(blocks[::-1])
        if hi:
            self._drop(hashes[hi - 1::-1])

    def _drop(self, blocks: list[int]) -> None:
        """One reference less on each of `blocks`, in order; a block left with none goes to the LRU tail."""
        used = self.cached_used
        if len(blocks) <= SHORT:
            freed = self._drop_each(blocks)
        else:
            counts = list(map(used.pop, blocks, repeat(0)))  # out of `used`, in C (a block listed twice: 0)
            if max(counts) == 1:  # every block freed (none listed twice: that would count 2)
                self.free.append(blocks, self.free_whole)
                return
            if 0 in counts:  # a block listed twice: back as they were, then one at a time, as the order matters
                used.update(zip(blocks[::-1], counts[::-1]))
                freed = self._drop_each(blocks)
            else:
                stay = list(map((1).__lt__, counts))
                freed = list(compress(blocks, map(not_, stay)))
                used.update(zip(compress(blocks, stay), map((-1).__add__, compress(counts, stay))))
        if freed:
            self.free.append(freed, self.free_whole)

    def _drop_each(self, blocks: list[int]) -> list[int]:
        """`_drop` a block at a time: the blocks left with no reference, in order (not yet freed)."""
        used = self.cached_used
        freed = []
        for h in blocks:
            c = used[h] - 1
            if c:
                used[h] = c
            else:
                del used[h]
                freed.append(h)
        return freed

    def reset_prefix_cache(self) -> None:
        self.free_anon += self.num_free - self.free_anon
        for e in self.free.whole():  # free pieces and spans end with the rest of the free list
            self._evict_whole(e, self.num_blocks)
        self.free.clear()
