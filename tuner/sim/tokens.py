"""The simulator's tokenizer and vLLM-style prefix block hashing.

The simulator has no model vocabulary, so it counts a token per GPT-2-style pre-token (a word with its
leading space, or a run of punctuation). Prompts the replay client synthesises are built from common
English words that real BPE tokenizers keep whole, so this count and a real tokenizer's agree within a few
percent. Block hashes chain like vLLM's: block i's hash covers its 16 tokens and the hash of block i-1, so
two prompts share cached blocks exactly as far as their token prefixes agree.
"""

from __future__ import annotations

import re
import zlib
from typing import Sequence

_PRETOKEN = re.compile(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]+|\s+")

BLOCK_SIZE = 16


def tokenize(text: str) -> list[int]:
    """Stable token ids for `text` (crc32 of each pre-token)."""
    return [zlib.crc32(p.encode()) for p in _PRETOKEN.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PRETOKEN.findall(text))


def block_hashes(tokens: Sequence[int], block_size: int = BLOCK_SIZE) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (a trailing partial block is never cached)."""
    out: list[int] = []
    parent = 0
    for i in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[i:i + block_size])))
        out.append(parent)
    return out


_ID_CHAIN: dict[tuple, tuple[tuple[int, ...], int]] = {}


def _id_chain(parent: int, hid: int, start: int, first: int, count: int, block_size: int
              ) -> tuple[tuple[int, ...], int]:
    """Chained hashes of `count` blocks inside one id block, memoised: a shared document's chain is
    computed once, not once per request that quotes it."""
    key = (parent, hid, start, first, count, block_size)
    hit = _ID_CHAIN.get(key)
    if hit is None:
        out = []
        p = parent
        for j in range(count):
            p = hash((p, (hid, first + j * block_size - start)))
            out.append(p)
        hit = (tuple(out), p)
        if len(_ID_CHAIN) > 200_000:
            _ID_CHAIN.clear()
        _ID_CHAIN[key] = hit
    return hit


def block_hashes_from_ids(hash_ids: Sequence[int], hash_block_size: int, prompt_tokens: int,
                          unique: int, block_size: int = BLOCK_SIZE) -> list[int]:
    """Block hashes for a prompt described by trace hash ids (Mooncake: one id per 512-token block).

    Tokens covered by an id hash by (id, offset); tokens past the ids are unique to the request
    (`unique`, e.g. its index). Chaining keeps vLLM's rule that a block hits only if its whole prefix does.
    """
    out: list[int] = []
    parent = 0
    n_full = prompt_tokens // block_size
    b = 0
    for k, hid in enumerate(hash_ids):
        start = k * hash_block_size
        # full sim blocks that lie entirely inside id block k
        first_b = -(-start // block_size)
        last_b = min(n_full, ((k + 1) * hash_block_size) // block_size)
        if first_b != b or last_b <= first_b:
            break
        chain, parent = _id_chain(parent, hid, start, first_b * block_size, last_b - first_b, block_size)
        out.extend(chain)
        b = last_b
    for bb in range(b, n_full):
        parent = hash((parent, (unique, bb, -1)))  # 3-tuple: never equal to an id key
        out.append(parent)
    return out
