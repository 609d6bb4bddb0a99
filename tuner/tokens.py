"""Token counts and ids for the simulator, and vLLM-style prefix block hashing.

vLLM counts a prompt with the model's own tokenizer, and how far any other count is off depends on both
the text and the tokenizer: a vLLM-bench "random" prompt of 512 tokens of the CI tiny model (decoded random
token ids, mostly sub-word pieces glued together) is about 170 GPT-2-style pre-tokens, while a prompt made
of common English words is one pre-token per real token (`benchmarks/token_counts.py` prints both). So the
count comes from one place, a `TokenCounter`:

- `token_counter_for(model)` reads `tokenizer.json` next to the model (a local folder, or the folder of a
  `config.json`) with the `tokenizers` library: exact ids and counts, as vLLM's tokenizer would give for a
  completions prompt (special tokens such as a BOS added by the tokenizer's post-processor included).
- otherwise the estimate: a token per GPT-2-style pre-token (a word with its leading space, or a run of
  punctuation), ids being crc32s of the pre-tokens. No hub access: a model given by hub id is estimated.

Both in-process (`tuner.engine.sim`) and HTTP (`tuner.sim.server`) simulators, and the workload
statistics, take their counter from here and say which one was used (`TokenCounter.source`).

Block hashes chain like vLLM's: block i's hash covers its 16 token ids and the hash of block i-1, so two
prompts share cached blocks exactly as far as their token prefixes agree.
"""

from __future__ import annotations

import os
import re
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Protocol, Sequence

_PRETOKEN = re.compile(r" ?[A-Za-z0-9_]+| ?[^\sA-Za-z0-9_]+|\s+")

BLOCK_SIZE = 16


def tokenize(text: str) -> list[int]:
    """Stable token ids for `text` (crc32 of each pre-token)."""
    return [zlib.crc32(p.encode()) for p in _PRETOKEN.findall(text)]


def count_tokens(text: str) -> int:
    """The estimate: one token per pre-token (for callers that know no model)."""
    return len(_PRETOKEN.findall(text))


ESTIMATE = "estimated: ~1 token per word-piece; pass a local model folder with tokenizer.json for exact counts"


class TokenCounter(Protocol):
    #: how the counts were made, in words, for logs, workload statistics and reports
    source: str
    exact: bool

    def ids(self, text: str, *, special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `special_tokens=False` for text a chat template already rendered (vLLM
        encodes that without adding the tokenizer's own special tokens again)."""
        ...

    def count(self, text: str) -> int: ...


class RegexCounter:
    """The estimate, for a model with no local tokenizer.json."""

    source = ESTIMATE
    exact = False

    def ids(self, text: str, *, special_tokens: bool = True) -> list[int]:
        return tokenize(text)

    def count(self, text: str) -> int:
        return count_tokens(text)


class TokenizerFileCounter:
    """Exact counts from a model's `tokenizer.json` (the `tokenizers` library: no hub, no transformers)."""

    exact = True

    def __init__(self, path: str | os.PathLike):
        from tokenizers import Tokenizer

        self.path = Path(path)
        self._tok = Tokenizer.from_file(str(self.path))
        self.source = f"tokens counted with {self.path}"

    def ids(self, text: str, *, special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=special_tokens).ids

    def count(self, text: str) -> int:
        return len(self.ids(text))


def tokenizer_file(model: str | os.PathLike | None) -> Path | None:
    """The `tokenizer.json` of a model reference: a folder holding one, or a file (its `config.json`)
    whose folder does; None for a built-in profile name, a hub id or a folder without one."""
    if not model:
        return None
    p = Path(model).expanduser()
    folder = p if p.is_dir() else p.parent if p.is_file() else None
    if folder is None or not (folder / "tokenizer.json").is_file():
        return None
    return (folder / "tokenizer.json").resolve()


@lru_cache(maxsize=8)
def _file_counter(path: Path) -> TokenizerFileCounter:
    return TokenizerFileCounter(path)  # loading a large vocabulary takes a while: once per process


def token_counter_for(model: str | os.PathLike | None) -> TokenCounter:
    """The counter for `--model`: the model's tokenizer.json when it is local, else the estimate."""
    path = tokenizer_file(model)
    return RegexCounter() if path is None else _file_counter(path)


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
    if hash_block_size == block_size:  # one id a block (chat traces): `_id_chain`'s hash, without its memo's
        for hid in hash_ids[:n_full]:  # 6-tuple key, which cost as much as the hash it saves
            parent = hash((parent, (hid, 0)))
            out.append(parent)
        b = len(out)
        hash_ids = ()
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
