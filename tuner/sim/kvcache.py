"""The paged KV pool with vLLM's automatic prefix caching.

Blocks are counted, not materialised: a block is either free and anonymous, free but still holding a
cached prefix (evictable, in LRU order), or in use. A full prompt block is registered under its chained
hash once computed; when its last user finishes it becomes free-but-cached, and a later request with the
same prefix takes it back instead of recomputing it. Allocation takes anonymous blocks first, then evicts
the least recently freed cached block.

A 32k-token prompt is 2,000 blocks, and every admission, first token and finish touches each of them:
finding the cached prefix and taking references run in C (`takewhile`, `filter`, Counter's
`_count_elements`, all lazy, so a hash listed twice is handled as the one-at-a-time loop would), not in
a Python loop per block. On the RAG space those loops were most of the twin's ranking time.
"""

from __future__ import annotations

from collections import OrderedDict, _count_elements  # type: ignore[attr-defined]
from itertools import islice, takewhile
from typing import Sequence


class BlockPool:
    __slots__ = ("num_blocks", "caching", "free_anon", "cached_free", "cached_used")

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.caching = enable_caching
        self.free_anon = num_blocks
        self.cached_free: OrderedDict[int, None] = OrderedDict()
        self.cached_used: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return self.free_anon + len(self.cached_free)

    @property
    def usage(self) -> float:
        """vllm:kv_cache_usage_perc: the fraction of blocks in use (free cached blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def match(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """Length of the cached prefix of `hashes` (at most `max_blocks`), and how many of those blocks
        sit in the free list (taking them reduces the free count)."""
        if not self.caching or max_blocks <= 0:
            return 0, 0
        used, free = self.cached_used, self.cached_free
        hs = hashes[:max_blocks]
        n = len(list(takewhile(used.__contains__, hs)))  # the prefix in use by others, in C
        from_free = 0
        for h in islice(hs, n, None):  # then blocks in use or free-but-cached, to the first miss
            if h in used:
                n += 1
            elif h in free:
                n += 1
                from_free += 1
            else:
                break
        return n, from_free

    def ref(self, hashes: Sequence[int], from_free: int | None = None) -> None:
        """Take a reference on cached blocks found by `match` (`from_free`: how many of them sit in the
        free list, as `match` said; 0 skips looking there)."""
        used, free = self.cached_used, self.cached_free
        if from_free != 0:
            for h in filter(free.__contains__, hashes):
                del free[h]
        _count_elements(used, hashes)  # used[h] = used.get(h, 0) + 1 for each, in C

    def take(self, n: int) -> bool:
        """Allocate `n` fresh blocks, evicting cached ones if needed. False (and nothing taken) if short."""
        if n <= self.free_anon:
            self.free_anon -= n
            return True
        if n > self.free_anon + len(self.cached_free):
            return False
        n -= self.free_anon
        self.free_anon = 0
        pop = self.cached_free.popitem
        for _ in range(n):
            pop(last=False)
        return True

    def register(self, h: int) -> bool:
        """A freshly computed anonymous block now holds prefix `h`: cache it. False if `h` was cached
        already (another request computed the same block at the same time); it then stays anonymous."""
        if not self.caching or h in self.cached_used or h in self.cached_free:
            return False
        self.cached_used[h] = 1
        return True

    def release(self, hashes: Sequence[int], n_anon: int) -> None:
        """Free a request's blocks: cached ones go to the LRU tail in reverse order (so a prompt's tail
        blocks are evicted before its head, as in vLLM), anonymous ones back to the free count."""
        used, free = self.cached_used, self.cached_free
        for h in reversed(hashes):
            c = used[h] - 1
            if c:
                used[h] = c
            else:
                del used[h]
                free[h] = None
        self.free_anon += n_anon

    def reset_prefix_cache(self) -> None:
        self.free_anon += len(self.cached_free)
        self.cached_free.clear()
