"""Seeded synthetic workloads whose prefix sharing is known exactly.

Real traces rarely come with prompt text, and random prompts share nothing, so neither says whether prefix
caching (or a larger KV pool that keeps prefixes alive) pays off. These workloads describe each prompt as
token counts plus `prefix_hash_ids`: equal ids are equal token blocks, so a system prompt, a RAG document or
a tenant's instructions are shared exactly, and everything else is unique. The replay client renders text
from the ids later; the simulator hashes the ids directly.

Id ranges are disjoint so unrelated blocks never collide: fixed ranges for shared content (the same chat
system prompt in every chat workload, like one deployment's), and a per-(kind, seed) salted range for
unique blocks, so two workloads replayed back to back against one server do not fake cache hits.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from tuner.errors import UserError
from tuner.workload.model import Workload, WorkloadRequest

Kind = Literal["chat", "rag", "multitenant"]
KINDS: tuple[str, ...] = ("chat", "rag", "multitenant", "longtail", "multitenant-lora")

SYNTH_BLOCK = 16  # vLLM's KV block size: shared prefixes of whole blocks map to exact cache blocks
PREFIX_QUANTUM = 256  # every shared prefix is a multiple of this, so any block size dividing it stays exact

CHAT_SYSTEM_BASE = 1_000  # chat system prompt blocks
RAG_DOC_BASE = 100_000  # + doc * 10_000 + block
TENANT_BASE = 1_000_000  # + tenant * 10_000 + block
UNIQUE_BASE = 1_000_000_000  # + salt * UNIQUE_STRIDE + counter
UNIQUE_STRIDE = 10_000_000
_SALTS = 100_000

CHAT_SYSTEM_TOKENS = 256
CHAT_SYSTEM_SHARE = 0.8
RAG_DOCS = 6
RAG_DOC_RANGE = (8_192, 24_576)
RAG_PROMPT_MAX = 32_768
MT_TENANTS = 48
MT_ZIPF_S = 1.1
MT_SYSTEM_QUANTA = (1, 8)  # tenant system prompts of 256..2048 tokens
LORA_ADAPTERS = 100  # multitenant-lora: one adapter per tenant, Zipf-popular (alpha)
LORA_ALPHA = 1.0
LORA_MAX_ADAPTERS = 100_000


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, n: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, size=n)), lo, hi).astype(int)


class _Ids:
    """Hands out unique block ids from this workload's salted range."""

    def __init__(self, rng: np.random.Generator):
        self.next = UNIQUE_BASE + int(rng.integers(0, _SALTS)) * UNIQUE_STRIDE

    def take(self, tokens: int, block: int) -> list[int]:
        k = -(-tokens // block)  # a trailing partial block still gets an id (the Mooncake convention)
        out = list(range(self.next, self.next + k))
        self.next += k
        return out


def _shared(base: int, tokens: int, block: int) -> list[int]:
    return [base + i for i in range(tokens // block)]


def _chat(rng: np.random.Generator, n: int, block: int) -> list[WorkloadRequest]:
    """~512 prompt / ~256 output tokens; 80% of requests open with the same 256-token system prompt."""
    ids = _Ids(rng)
    user = _lognormal(rng, 255, 0.6, 16, 3_840, n)
    out = _lognormal(rng, 225, 0.5, 1, 2_048, n)
    has_system = rng.random(n) < CHAT_SYSTEM_SHARE
    system = _shared(CHAT_SYSTEM_BASE, CHAT_SYSTEM_TOKENS, block)
    reqs = []
    for u, o, s in zip(user.tolist(), out.tolist(), has_system.tolist()):
        prefix = system if s else []
        reqs.append(WorkloadRequest(prompt_tokens=u + (CHAT_SYSTEM_TOKENS if s else 0), output_tokens=o,
                                    prefix_hash_ids=prefix + ids.take(u, block), hash_block_size=block))
    return reqs


def _rag(rng: np.random.Generator, n: int, block: int) -> list[WorkloadRequest]:
    """One of a few 8k-24k documents as the prefix, a unique question/passages tail, 64-256 output tokens."""
    ids = _Ids(rng)
    lo, hi = RAG_DOC_RANGE
    doc_len = rng.integers(lo // PREFIX_QUANTUM, hi // PREFIX_QUANTUM + 1, size=RAG_DOCS) * PREFIX_QUANTUM
    weights = 1.0 / np.arange(1, RAG_DOCS + 1)  # some documents are asked about more than others
    doc = rng.choice(RAG_DOCS, size=n, p=weights / weights.sum())
    tail = _lognormal(rng, 1_500, 0.8, 64, 8_192, n)
    out = rng.integers(64, 257, size=n)
    reqs = []
    for d, t, o in zip(doc.tolist(), tail.tolist(), out.tolist()):
        d_len = int(doc_len[d])
        t = min(t, RAG_PROMPT_MAX - d_len)
        prefix = _shared(RAG_DOC_BASE + d * 10_000, d_len, block)
        reqs.append(WorkloadRequest(prompt_tokens=d_len + t, output_tokens=o,
                                    prefix_hash_ids=prefix + ids.take(t, block), hash_block_size=block))
    return reqs


def _multitenant(rng: np.random.Generator, n: int, block: int) -> list[WorkloadRequest]:
    """Zipf-popular tenants, each with its own 256-2048-token system prompt, chat-like user turns."""
    ids = _Ids(rng)
    sys_len = rng.integers(MT_SYSTEM_QUANTA[0], MT_SYSTEM_QUANTA[1] + 1, size=MT_TENANTS) * PREFIX_QUANTUM
    weights = 1.0 / np.arange(1, MT_TENANTS + 1) ** MT_ZIPF_S
    tenant = rng.choice(MT_TENANTS, size=n, p=weights / weights.sum())
    user = _lognormal(rng, 300, 0.7, 16, 4_096, n)
    out = _lognormal(rng, 200, 0.6, 1, 2_048, n)
    reqs = []
    for k, u, o in zip(tenant.tolist(), user.tolist(), out.tolist()):
        s_len = int(sys_len[k])
        prefix = _shared(TENANT_BASE + k * 10_000, s_len, block)
        reqs.append(WorkloadRequest(prompt_tokens=s_len + u, output_tokens=o, tenant=f"tenant-{k:03d}",
                                    prefix_hash_ids=prefix + ids.take(u, block), hash_block_size=block))
    return reqs


def _longtail(rng: np.random.Generator, n: int, block: int) -> list[WorkloadRequest]:
    """Long conversations as public traces show them: a heavy-tailed prompt (median ~900 tokens,
    lognormal sigma 1.6, up to 128k) under the same system prompt as chat, so about 1.5% of the
    prompts exceed a 32k context, as in the Azure conversation trace against a 32k model. What a
    tuner must do with those (count them as their own failure, name the cause) is the point."""
    ids = _Ids(rng)
    system = _shared(CHAT_SYSTEM_BASE, CHAT_SYSTEM_TOKENS, block)
    user = _lognormal(rng, 640, 1.6, 16, 131_072 - CHAT_SYSTEM_TOKENS, n)
    out = _lognormal(rng, 200, 0.6, 1, 1_024, n)
    return [WorkloadRequest(prompt_tokens=CHAT_SYSTEM_TOKENS + u, output_tokens=o,
                            prefix_hash_ids=system + ids.take(u, block), hash_block_size=block)
            for u, o in zip(user.tolist(), out.tolist())]


def lora_name(k: int) -> str:
    """The adapter of tenant `k` (`tenant-007` is served by `lora-007`)."""
    return f"lora-{k:03d}"


def _multitenant_lora(rng: np.random.Generator, n: int, block: int, adapters: int = LORA_ADAPTERS,
                      alpha: float = LORA_ALPHA) -> list[WorkloadRequest]:
    """One base model, one LoRA adapter per tenant, tenants Zipf(alpha)-popular (the Punica/S-LoRA
    workloads; SGLang's `--lora-request-distribution skewed`): a 256-token tenant system prompt and a
    chat-like turn, each request naming its tenant's adapter."""
    ids = _Ids(rng)
    weights = 1.0 / np.arange(1, adapters + 1) ** alpha
    tenant = rng.choice(adapters, size=n, p=weights / weights.sum())
    user = _lognormal(rng, 300, 0.7, 16, 4_096, n)
    out = _lognormal(rng, 128, 0.6, 1, 1_024, n)
    reqs = []
    for k, u, o in zip(tenant.tolist(), user.tolist(), out.tolist()):
        prefix = _shared(TENANT_BASE + k * 10_000, PREFIX_QUANTUM, block)
        reqs.append(WorkloadRequest(prompt_tokens=PREFIX_QUANTUM + u, output_tokens=o, tenant=f"tenant-{k:03d}",
                                    lora=lora_name(k), prefix_hash_ids=prefix + ids.take(u, block),
                                    hash_block_size=block))
    return reqs


_BUILDERS = {"chat": _chat, "rag": _rag, "multitenant": _multitenant, "longtail": _longtail,
             "multitenant-lora": _multitenant_lora}


def synthesize(kind: str, n: int, seed: int = 0, hash_block_size: int = SYNTH_BLOCK, *,
               adapters: int = LORA_ADAPTERS, alpha: float = LORA_ALPHA) -> Workload:
    """`n` requests of `kind` (chat | rag | multitenant | longtail | multitenant-lora), identical for
    identical arguments. `adapters` and `alpha` (Zipf) shape multitenant-lora.

    `hash_block_size` must divide 256 (and be a multiple of 16) so every shared prefix is whole blocks;
    a larger one (e.g. 256) only makes files with long shared documents smaller, the sharing is the same.
    """
    if kind not in _BUILDERS:
        raise UserError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})", field="kind")
    if n < 1:
        raise UserError(f"must be >= 1, got {n}", field="requests")
    if hash_block_size < SYNTH_BLOCK or hash_block_size % SYNTH_BLOCK or PREFIX_QUANTUM % hash_block_size:
        raise UserError(f"must be a multiple of {SYNTH_BLOCK} dividing {PREFIX_QUANTUM}, got {hash_block_size}",
                        field="hash_block_size")
    # one stream per (kind, seed): chat and rag of the same seed are unrelated draws with unrelated ids
    if seed < 0:
        raise UserError(f"must be >= 0, got {seed}", field="seed")
    if not 1 <= adapters <= LORA_MAX_ADAPTERS:
        raise UserError(f"must be 1..{LORA_MAX_ADAPTERS}, got {adapters}", field="adapters")
    if not 0.0 <= alpha <= 10.0:
        raise UserError(f"must be 0..10 (0: uniform), got {alpha}", field="alpha")
    rng = np.random.default_rng([int(seed), KINDS.index(kind)])
    extra = {"adapters": adapters, "alpha": alpha} if kind == "multitenant-lora" else {}
    reqs = _BUILDERS[kind](rng, n, hash_block_size, **extra)
    return Workload(name=f"{kind}-seed{seed}", source_format=f"synth-{kind}", requests=reqs)
