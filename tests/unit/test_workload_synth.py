"""The synthesizer is repeatable and delivers the lengths and prefix sharing each kind promises."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tuner.errors import UserError
from tuner.workload.loader import load_workload, save_workload
from tuner.workload.stats import describe, histogram, prefix_sharing
from tuner.workload.synth import (CHAT_SYSTEM_BASE, CHAT_SYSTEM_TOKENS, UNIQUE_BASE, synthesize)

N = 2000


@pytest.fixture(scope="module")
def chat():
    return synthesize("chat", N, seed=0)


@pytest.fixture(scope="module")
def rag():
    return synthesize("rag", 600, seed=0)


@pytest.fixture(scope="module")
def mt():
    return synthesize("multitenant", N, seed=0)


@pytest.mark.parametrize("kind", ["chat", "rag", "multitenant"])
def test_same_seed_same_workload_other_seed_other_workload(kind: str) -> None:
    a, b, c = synthesize(kind, 200, seed=7), synthesize(kind, 200, seed=7), synthesize(kind, 200, seed=8)
    assert a.requests == b.requests
    assert [r.prompt_tokens for r in a.requests] != [r.prompt_tokens for r in c.requests]


@pytest.mark.parametrize("kind", ["chat", "rag", "multitenant"])
def test_ids_cover_the_prompt_and_never_collide_between_unrelated_blocks(kind: str) -> None:
    w = synthesize(kind, 300, seed=1)
    unique_seen: set[int] = set()
    for r in w.requests:
        assert r.prompt is None and r.hash_block_size == 16
        assert len(r.prefix_hash_ids) == math.ceil(r.prompt_tokens / 16)
        unique = [i for i in r.prefix_hash_ids if i >= UNIQUE_BASE]
        shared = [i for i in r.prefix_hash_ids if i < UNIQUE_BASE]
        assert r.prefix_hash_ids == shared + unique  # shared content is a prefix, never in the middle
        assert not unique_seen & set(unique)
        unique_seen |= set(unique)
    # another seed's unique blocks are another range: back-to-back runs fake no cache hits
    other = {i for r in synthesize(kind, 300, seed=2).requests for i in r.prefix_hash_ids if i >= UNIQUE_BASE}
    assert not unique_seen & other


def test_chat_lengths_and_shared_system_prompt(chat) -> None:
    p = np.array([r.prompt_tokens for r in chat.requests])
    o = np.array([r.output_tokens for r in chat.requests])
    assert p.mean() == pytest.approx(512, rel=0.08)
    assert o.mean() == pytest.approx(256, rel=0.08)
    assert p.min() >= 16 and p.max() <= CHAT_SYSTEM_TOKENS + 3840 and o.min() >= 1 and o.max() <= 2048
    system = list(range(CHAT_SYSTEM_BASE, CHAT_SYSTEM_BASE + CHAT_SYSTEM_TOKENS // 16))
    with_system = [r for r in chat.requests if r.prefix_hash_ids[:16] == system]
    assert len(with_system) / N == pytest.approx(0.8, abs=0.03)
    reuse, sharing = prefix_sharing(chat)
    assert sharing == pytest.approx(len(with_system) / N)
    # reused blocks = the system blocks of every system request but the first
    blocks = sum(len(r.prefix_hash_ids) for r in chat.requests)
    assert reuse == pytest.approx((len(with_system) - 1) * 16 / blocks)
    assert 0.3 < reuse < 0.5


def test_rag_long_prompts_shared_documents_short_outputs(rag) -> None:
    p = np.array([r.prompt_tokens for r in rag.requests])
    o = np.array([r.output_tokens for r in rag.requests])
    assert p.min() >= 8192 and p.max() <= 32768
    assert o.min() >= 64 and o.max() <= 256
    docs = Counter(tuple(i for i in r.prefix_hash_ids if i < UNIQUE_BASE) for r in rag.requests)
    assert 2 <= len(docs) <= 8  # "one of a few documents"
    assert all(8192 <= 16 * len(d) <= 24576 for d in docs)
    reuse, sharing = prefix_sharing(rag)
    assert reuse > 0.8 and sharing == 1.0


def test_multitenant_zipf_tenants_with_own_system_prompts(mt) -> None:
    counts = Counter(r.tenant for r in mt.requests)
    assert len(counts) >= 30
    top, *_ = counts.most_common(1)[0][1], None
    assert top / N > 0.1  # the head of a Zipf distribution
    assert top > 5 * np.median(list(counts.values()))
    prefixes: dict[str, tuple[int, ...]] = {}
    for r in mt.requests:
        shared = tuple(i for i in r.prefix_hash_ids if i < UNIQUE_BASE)
        assert 256 <= 16 * len(shared) <= 2048
        assert prefixes.setdefault(r.tenant, shared) == shared  # one system prompt per tenant
    owners: dict[int, str] = {}
    for tenant, ids in prefixes.items():
        for i in ids:
            assert owners.setdefault(i, tenant) == tenant  # no block shared across tenants
    s = describe(mt)
    assert s.tenants == len(counts)
    assert 0.4 < s.block_reuse < 0.8


def test_shipped_workloads_are_what_the_readme_command_produces(tmp_path: Path) -> None:
    for kind, n, block in (("chat", 1500, 16), ("rag", 500, 256), ("multitenant", 1000, 16)):
        shipped = ROOT / "workloads" / f"{kind}.jsonl"
        fresh = save_workload(synthesize(kind, n, seed=0, hash_block_size=block), tmp_path / f"{kind}.jsonl")
        assert fresh.read_bytes() == shipped.read_bytes(), kind
        assert shipped.stat().st_size < 1_000_000
        assert len(load_workload(shipped).requests) == n


def test_larger_block_size_keeps_the_sharing() -> None:
    small, big = synthesize("rag", 100, seed=3), synthesize("rag", 100, seed=3, hash_block_size=256)
    assert [r.prompt_tokens for r in small.requests] == [r.prompt_tokens for r in big.requests]
    assert prefix_sharing(small)[1] == prefix_sharing(big)[1]
    assert prefix_sharing(big)[0] == pytest.approx(prefix_sharing(small)[0], abs=0.02)


@pytest.mark.parametrize("args,match", [
    (("poem", 10, 0), "kind: unknown kind 'poem'"),
    (("chat", 0, 0), "requests: must be >= 1"),
    (("chat", 10, -1), "seed: must be >= 0"),
])
def test_bad_synth_arguments(args: tuple, match: str) -> None:
    with pytest.raises(UserError, match=match):
        synthesize(*args)
    with pytest.raises(UserError, match="hash_block_size"):
        synthesize("chat", 10, 0, hash_block_size=24)


def test_histogram_bins_are_powers_of_two_and_count_everything() -> None:
    values = [1, 3, 70, 700, 7000, 7001]
    bins = histogram(values)
    assert sum(b.count for b in bins) == len(values)
    assert all(b.lo & (b.lo - 1) == 0 for b in bins)  # powers of two
    assert all(a.hi == b.lo for a, b in zip(bins, bins[1:]))
    assert bins[0].lo <= 1 and bins[-1].hi > 7001
    assert len(bins) <= 12
    assert [(b.lo, b.count) for b in histogram([100, 200, 300])] == [(64, 1), (128, 1), (256, 1)]
