"""The KV pool's free-but-cached blocks in LRU order (`tuner.sim.kvcache.BlockPool.free`).

The free list is a plain dict and a deque of runs in LRU order, not an OrderedDict (five times cheaper a
block). A block freed on its own is a key of `blocks` (hash -> its entry's stamp, (run << 32) + its
place in the run); the order is `runs`: [run, blocks, next, live, None] runs, oldest first (one a
release; short releases share the newest run), whose entries are current where the block's stamp is the
entry's (a block taken back leaves a stale one); `live` counts the current ones from `next` on, less
those taken back since (counted by run in `taken`), so a run all taken back is skipped whole.

A run may also stand for blocks the pool keeps whole, outside `blocks` (a free piece, a free span): its
last item is then the pool's entry for them, and the run is current while that entry's third item points
back at it. The free list counts such a run as one entry and leaves its blocks to the pool: `evict_whole`
evicts some from it (ending it, shortening it, or unfolding it into a run of its own blocks, `unfold`),
`whole_order` lists them, least recently freed first.
"""

from __future__ import annotations

from collections import _count_elements, deque  # type: ignore[attr-defined]
from itertools import compress, count, repeat
from operator import eq
from typing import Callable, Iterable

#: Lists of blocks at most this long are freed in a plain loop (`tuner.sim.kvcache`) or appended to the
#: newest run: the C passes cost more than they save on a chat prompt's few dozen blocks.
SHORT = 48
#: The runs are compacted when their entries pass 4x the free-but-cached blocks plus this many (a block
#: taken back leaves its entry behind until eviction reaches it or a compaction drops it).
LRU_SLACK = 65536


def consume(it: Iterable) -> None:
    """Run an iterator of calls (a `map`) to its end, in C."""
    deque(it, maxlen=0)


class FreeList:
    __slots__ = ("blocks", "runs", "stamp", "entries", "taken", "evict_whole", "whole_order")

    def __init__(self, evict_whole: Callable[[list, int], int], whole_order: Callable[[list], list[int]]):
        self.blocks: dict[int, int] = {}
        self.runs: deque[list] = deque()
        self.stamp = 0
        self.entries = 0  # entries in `runs` from each run's next (a whole run: one), stale included
        self.taken: dict[int, int] = {}
        #: the pool's: evict up to n blocks of a whole run's entry, last first (how many it evicted);
        #: a whole run's blocks, least recently freed first
        self.evict_whole = evict_whole
        self.whole_order = whole_order

    def append(self, blocks: list[int], whole_free: int) -> None:
        """`blocks` (none listed twice, none free) go to the LRU tail, in order: a run of their own, or
        when short the newest run's end (a chat release's blocks, one run each, cost more to evict).
        `whole_free`: the pool's free blocks outside `blocks` (for the compaction's bound)."""
        runs = self.runs
        if len(blocks) <= SHORT and runs and runs[-1][4] is None and len(runs[-1][1]) < 4096:
            run = runs[-1]
            self.blocks.update(zip(blocks, count((run[0] << 32) + len(run[1]))))
            run[1].extend(blocks)
            run[3] += len(blocks)
        else:
            self.stamp = rid = self.stamp + 1
            self.blocks.update(zip(blocks, count(rid << 32)))
            runs.append([rid, blocks, 0, len(blocks), None])
        self.entries += len(blocks)
        if self.entries > 4 * (len(self.blocks) + whole_free) + LRU_SLACK:
            self._compact()  # mostly taken back: keep memory bounded

    def append_whole(self, entry: list) -> list:
        """A run at the LRU tail for blocks the pool keeps whole (`entry`: the pool's); returns it."""
        self.stamp += 1
        run = [self.stamp, None, 0, 0, entry]
        self.runs.append(run)
        self.entries += 1
        return run

    def unfold(self, run: list, blocks: list[int]) -> None:
        """Whole run `run` becomes a run of `blocks` (in LRU order) one by one, in its place."""
        self.blocks.update(zip(blocks, count(run[0] << 32)))
        run[1:] = [blocks, 0, len(blocks), None]
        self.entries += len(blocks) - 1

    def take_back(self, hashes: list[int]) -> None:
        """Those of `hashes` that are free leave the free list, counted by run (lazily: a hash listed twice
        is taken once)."""
        free = self.blocks
        _count_elements(self.taken, map((32).__rrshift__, map(free.pop, filter(free.__contains__, hashes))))

    def evict(self, n: int) -> None:
        """Evict the `n` least recently freed blocks (there are that many, counting the pool's whole runs)."""
        run = self.runs[0]  # the common cases first: the oldest run holds the n blocks
        rid, blocks, i, live, e = run
        if e is not None:  # a whole run: the pool's (a free span is shortened: one call)
            if e[2] is run:
                n -= self.evict_whole(e, n)
                if not n:
                    return
        else:
            if rid in self.taken:
                run[3] = live = live - self.taken.pop(rid)
            stale = len(blocks) - i - live
            if n < live and stale <= SHORT:
                free = self.blocks
                if not stale:
                    consume(map(free.__delitem__, blocks[i:i + n]))
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
                self.entries -= j - i
                return
        self._evict(n)

    def _evict(self, n: int) -> None:
        free, runs, taken = self.blocks, self.runs, self.taken
        while n:
            run = runs[0]
            rid, blocks, i, live, e = run
            if e is not None:  # a whole run: the pool's to evict from (stale once the pool took it back)
                if e[2] is run:
                    n -= self.evict_whole(e, n)
                else:
                    self.entries -= 1
                    runs.popleft()
                continue
            if rid in taken:
                run[3] = live = live - taken.pop(rid)
            rest = len(blocks) - i
            if live <= n:  # the whole run goes (nothing to evict in one that was all taken back)
                if live:
                    seg = blocks[i:] if i else blocks
                    consume(map(free.__delitem__, compress(seg, self._current(rid, seg, i))))
                    n -= live
                self.entries -= rest
                runs.popleft()
                continue
            stale = rest - live
            seg = blocks[i:i + n + stale]  # holds at least n current entries
            if stale:
                current = list(self._current(rid, seg, i))
                cut = list(compress(range(len(seg)), current))[n - 1] + 1
                seg = seg[:cut]
                consume(map(free.__delitem__, compress(seg, current)))
            else:
                consume(map(free.__delitem__, seg))
            self.entries -= len(seg)
            run[2] = i + len(seg)
            run[3] = live - n
            return

    def _current(self, rid: int, seg: list[int], at: int):
        """Whether each entry of `seg` (run `rid`'s entries from place `at` on) is current, lazily, in C."""
        return map(eq, map(self.blocks.get, seg, repeat(-1)), count((rid << 32) + at))

    def _compact(self) -> None:
        """Each run keeps only its current entries, in order, renumbered; empty runs go."""
        free, taken, runs = self.blocks, self.taken, []
        for run in self.runs:
            rid, blocks, i, _, e = run
            if e is not None:
                if e[2] is run:
                    runs.append(run)
                continue
            taken.pop(rid, None)
            kept = list(compress(blocks[i:], self._current(rid, blocks[i:], i)))
            if kept:
                free.update(zip(kept, count(rid << 32)))
                runs.append([rid, kept, 0, len(kept), None])
        self.runs = deque(runs)
        self.entries = sum(len(r[1]) if r[4] is None else 1 for r in runs)

    def whole(self) -> list[list]:
        """The pool's entries of the current whole runs, oldest first."""
        return [run[4] for run in self.runs if run[4] is not None and run[4][2] is run]

    def order(self) -> list[int]:
        """The free-but-cached blocks, least recently freed first (the order eviction takes them)."""
        out: list[int] = []
        for run in self.runs:
            rid, blocks, i, _, e = run
            if e is None:
                out += compress(blocks[i:], self._current(rid, blocks[i:], i))
            elif e[2] is run:
                out += self.whole_order(e)
        return out

    def clear(self) -> None:
        self.blocks.clear()
        self.runs.clear()
        self.entries = 0
        self.taken.clear()
