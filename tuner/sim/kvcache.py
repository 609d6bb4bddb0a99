"""The paged KV pool with vLLM's automatic prefix caching.

Blocks are counted, not materialised: a block is either free and anonymous, free but still holding a
cached prefix (evictable, in LRU order), or in use. A full prompt block is registered under its chained
hash once computed; when its last user finishes it becomes free-but-cached, and a later request with the
same prefix takes it back instead of recomputing it. Allocation takes anonymous blocks first, then evicts
the least recently freed cached block.

A 32k-token prompt is 2,000 blocks, and on the RAG space nine in ten of them are a prefix other running
requests hold too: one reference more or less on each of them, a block at a time, was most of the twin's
ranking time. So a request's matched prefix is held in *pieces* of `PIECE` aligned blocks: a piece that
another running request already holds takes one reference on the piece (after comparing its blocks,
which for the shared prefix are the same objects), not one on each block, and only a piece's first holder
and its last pay per block. `cached_used[h]` counts a block's own references plus one per held piece it
lies in, so it is in use exactly when the block-at-a-time pool's count would be, and a piece's blocks
leave for the free list in the order that pool frees them (tests/unit/test_sim_kvcache_pieces.py keeps
the two in step). The free list is a plain dict and a deque of runs in LRU order, not an OrderedDict (a
block in and out of an OrderedDict cost five times as much). What is still done per block (finding the
cached prefix, freeing, evicting) runs in C (`takewhile`, `map`, `compress`, Counter's
`_count_elements`), lazily where a hash listed twice must be handled as the one-at-a-time loop would;
short lists (a chat prompt's) in plain loops, where C passes cost more than they save.
"""

from __future__ import annotations

from collections import _count_elements, deque  # type: ignore[attr-defined]
from itertools import compress, count, islice, repeat, takewhile
from operator import eq, not_
from typing import Sequence

#: Blocks in one piece of a held prefix (1,024 tokens at vLLM's 16-token blocks): a RAG prompt's shared
#: corpus is twenty-odd pieces; what is left past a prompt's last whole piece is held block by block.
PIECE = 64
#: Lists of blocks at most this long are freed in a plain loop: the C passes cost more than they save
#: on a chat prompt's few dozen blocks.
SHORT = 48
#: The LRU's runs are compacted when their entries pass 4x the free-but-cached blocks plus this many (a
#: block taken back leaves its entry behind until eviction reaches it or a compaction drops it).
LRU_SLACK = 65536


def _consume(it) -> None:
    deque(it, maxlen=0)


class BlockPool:
    __slots__ = ("num_blocks", "caching", "free_anon", "cached_free", "cached_used", "pieces", "piece",
                 "_lru", "_stamp", "_entries", "_taken")

    def __init__(self, num_blocks: int, enable_caching: bool = True, piece: int = PIECE):
        self.num_blocks = num_blocks
        self.caching = enable_caching
        self.free_anon = num_blocks
        #: free-but-cached blocks: hash -> its entry's stamp, (run << 32) + its place in the run. Their LRU
        #: order is `_lru`: [run, blocks, next, live] runs, oldest first (one a release; short releases
        #: share the newest run), whose entries are current where the block's stamp is the entry's (a
        #: block taken back leaves a stale entry; freed again, it counts at its later place); `live`
        #: counts the current ones from `next` on, less the blocks taken back since, counted by run in
        #: `_taken`. A plain dict and a deque of lists, not an
        #: OrderedDict: a fifth of the cost a block, and a run that was all taken back is skipped whole.
        self.cached_free: dict[int, int] = {}
        self._lru: deque[list] = deque()
        self._stamp = 0
        self._entries = 0  # entries in `_lru` from each run's next, stale ones included
        self._taken: dict[int, int] = {}
        self.cached_used: dict[int, int] = {}
        #: held pieces, by their last block's hash: [holders, the piece's blocks]
        self.pieces: dict[int, list] = {}
        self.piece = piece

    @property
    def num_free(self) -> int:
        return self.free_anon + len(self.cached_free)

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: the fraction of blocks in use (free cached blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def _held_pieces(self, hashes: Sequence[int], end: int) -> int:
        """How many blocks of `hashes[:end]` lie in whole pieces that running requests hold, from the
        first block on (each of those blocks is in use)."""
        pieces, W = self.pieces, self.piece
        n = 0
        while n + W <= end:
            e = pieces.get(hashes[n + W - 1])
            if e is None or e[1] != hashes[n:n + W]:  # the same objects for a shared prefix: a pointer compare
                break
            n += W
        return n

    def match(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """Length of the cached prefix of `hashes` (at most `max_blocks`), and how many of those blocks
        sit in the free list (taking them reduces the free count)."""
        if not self.caching or max_blocks <= 0:
            return 0, 0
        used, free = self.cached_used, self.cached_free
        end = min(max_blocks, len(hashes))
        n = self._held_pieces(hashes, end) if end >= self.piece and self.pieces else 0
        rest = hashes[n:end]
        k = len(list(takewhile(used.__contains__, rest)))  # blocks in use by others, in C
        from_free = 0
        while k < len(rest):  # then alternately free-but-cached and in-use runs, to the first miss
            f = len(list(takewhile(free.__contains__, islice(rest, k, None))))
            if not f:
                break
            from_free += f
            k += f
            k += len(list(takewhile(used.__contains__, islice(rest, k, None))))
        return n + k, from_free

    def ref(self, hashes: Sequence[int], from_free: int | None = None) -> int:
        """Take a reference on the cached blocks `hashes` found by `match` (`from_free`: how many of them
        sit in the free list, as `match` said; 0 skips looking there). Returns how many whole pieces
        from the first block on the caller now holds: pass it back to `release`."""
        used, free, pieces, W = self.cached_used, self.cached_free, self.pieces, self.piece
        n = len(hashes)
        p = 0
        while p + W <= n:  # pieces others hold: one reference more on each piece
            e = pieces.get(hashes[p + W - 1])
            if e is None or e[1] != hashes[p:p + W]:
                break
            e[0] += 1
            p += W
        rest = hashes[p:] if p else hashes
        if from_free != 0:  # out of the free list, counted by run (lazy: a hash listed twice is taken once)
            _count_elements(self._taken, map((32).__rrshift__, map(free.pop, filter(free.__contains__, rest))))
        _count_elements(used, rest)  # used[h] = used.get(h, 0) + 1 for each, in C
        q = p
        while q + W <= n:  # the rest's whole pieces: held as pieces from now on (their blocks counted once)
            key = hashes[q + W - 1]
            if key in pieces:  # a different piece with this last hash: the rest stays block by block
                break
            pieces[key] = [1, hashes[q:q + W]]
            q += W
        return q // W

    def take(self, n: int) -> bool:
        """Allocate `n` fresh blocks, evicting cached ones if needed. False (and nothing taken) if short."""
        if n <= self.free_anon:
            self.free_anon -= n
            return True
        if n > self.free_anon + len(self.cached_free):
            return False
        n -= self.free_anon
        self.free_anon = 0
        run = self._lru[0]  # the common case, inlined: the oldest run holds the n blocks to evict
        rid, blocks, i, live = run
        if rid in self._taken:
            run[3] = live = live - self._taken.pop(rid)
        stale = len(blocks) - i - live
        if n >= live or stale > SHORT:
            self._evict(n)
            return True
        free = self.cached_free
        if not stale:
            _consume(map(free.__delitem__, blocks[i:i + n]))
            j = i + n
        else:  # a few blocks taken back lie among them: walk past them
            j, k, get, stamp = i, n, free.get, (rid << 32) + i
            while k:
                h = blocks[j]
                if get(h) == stamp:
                    del free[h]
                    k -= 1
                j += 1
                stamp += 1
        run[2], run[3] = j, live - n
        self._entries -= j - i
        return True

    def _evict(self, n: int) -> None:
        """Evict the `n` least recently freed cached blocks (there are that many)."""
        free, lru, taken = self.cached_free, self._lru, self._taken
        while n:
            run = lru[0]
            rid, blocks, i, live = run
            if rid in taken:
                run[3] = live = live - taken.pop(rid)
            rest = len(blocks) - i
            if live <= n:  # the whole run goes (nothing to evict in one that was all taken back)
                if live:
                    seg = blocks[i:] if i else blocks
                    _consume(map(free.__delitem__, compress(seg, self._current(rid, seg, i))))
                    n -= live
                self._entries -= rest
                lru.popleft()
                continue
            stale = rest - live
            seg = blocks[i:i + n + stale]  # holds at least n current entries
            if stale:
                current = list(self._current(rid, seg, i))
                cut = list(compress(range(len(seg)), current))[n - 1] + 1
                seg = seg[:cut]
                _consume(map(free.__delitem__, compress(seg, current)))
            else:
                _consume(map(free.__delitem__, seg))
            self._entries -= len(seg)
            run[2] = i + len(seg)
            run[3] = live - n
            return

    def _current(self, rid: int, seg: list[int], at: int):
        """Whether each entry of `seg` (run `rid`'s entries from place `at` on) is current, lazily, in C."""
        return map(eq, map(self.cached_free.get, seg, repeat(-1)), count((rid << 32) + at))

    def _append_free(self, blocks: list[int]) -> None:
        """`blocks` (none listed twice, none free) go to the LRU tail, in order: a run of their own, or
        when short the newest run's end (a chat release's blocks, one run each, cost more to evict)."""
        lru = self._lru
        if len(blocks) <= SHORT and lru and len(lru[-1][1]) < 4096:
            run = lru[-1]
            at = len(run[1])
            self.cached_free.update(zip(blocks, count((run[0] << 32) + at)))
            run[1].extend(blocks)
            run[3] += len(blocks)
        else:
            self._stamp = rid = self._stamp + 1
            self.cached_free.update(zip(blocks, count(rid << 32)))
            lru.append([rid, blocks, 0, len(blocks)])
        self._entries += len(blocks)
        if self._entries > 4 * len(self.cached_free) + LRU_SLACK:  # mostly taken back: keep memory bounded
            self._compact()

    def _compact(self) -> None:
        """Each run keeps only its current entries, in order, renumbered; empty runs go."""
        free, taken, runs = self.cached_free, self._taken, []
        for rid, blocks, i, _ in self._lru:
            taken.pop(rid, None)
            kept = list(compress(blocks[i:], self._current(rid, blocks[i:], i)))
            if kept:
                free.update(zip(kept, count(rid << 32)))
                runs.append([rid, kept, 0, len(kept)])
        self._lru = deque(runs)
        self._entries = sum(len(r[1]) for r in runs)

    def lru_order(self) -> list[int]:
        """The free-but-cached blocks, least recently freed first (the order eviction takes them)."""
        return [h for rid, blocks, i, _ in self._lru
                for h in compress(blocks[i:], self._current(rid, blocks[i:], i))]

    def register(self, h: int) -> bool:
        """A freshly computed anonymous block now holds prefix `h`: cache it. False if `h` was cached
        already (another request computed the same block at the same time); it then stays anonymous."""
        if not self.caching or h in self.cached_used or h in self.cached_free:
            return False
        self.cached_used[h] = 1
        return True

    def release(self, hashes: Sequence[int], n_anon: int, pieces: int = 0) -> None:
        """Free a request's blocks (`pieces`: as `ref` returned): cached ones go to the LRU tail in
        reverse order (so a prompt's tail blocks are evicted before its head, as in vLLM), anonymous
        ones back to the free count."""
        self.free_anon += n_anon
        if not pieces:
            self._drop(hashes[::-1])
            return
        W = self.piece
        self._drop(hashes[:pieces * W - 1:-1])
        held = self.pieces
        for j in range(pieces - 1, -1, -1):
            key = hashes[(j + 1) * W - 1]
            e = held[key]
            e[0] -= 1
            if not e[0]:  # its last holder: its blocks lose the piece's reference
                del held[key]
                self._drop(e[1][::-1])

    def _drop(self, blocks: list[int]) -> None:
        """One reference less on each of `blocks`, in order; a block left with none goes to the LRU tail."""
        used = self.cached_used
        if len(blocks) <= SHORT:
            freed = self._drop_each(blocks)
        else:
            counts = list(map(used.pop, blocks, repeat(0)))  # out of `used`, in C (a block listed twice: 0)
            if max(counts) == 1:  # every block freed (none listed twice: that would count 2)
                self._append_free(blocks)
                return
            if 0 in counts:  # a block listed twice: back as they were, then one at a time, as the order matters
                used.update(zip(blocks[::-1], counts[::-1]))
                freed = self._drop_each(blocks)
            else:
                stay = list(map((1).__lt__, counts))
                freed = list(compress(blocks, map(not_, stay)))
                used.update(zip(compress(blocks, stay), map((-1).__add__, compress(counts, stay))))
        if freed:
            self._append_free(freed)

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
        self.free_anon += len(self.cached_free)
        self.cached_free.clear()
        self._lru.clear()
        self._entries = 0
        self._taken.clear()
