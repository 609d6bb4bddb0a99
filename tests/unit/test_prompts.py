
import pytest

from tuner.tokens import block_hashes, block_hashes_from_ids, count_tokens, tokenize
from tuner.workload.model import ChatMessage, WorkloadRequest
from tuner.workload.prompts import WORDS, render_messages, render_prompt


def _req(n, ids=None, bs=512, **kw):
    return WorkloadRequest(prompt_tokens=n, output_tokens=4, prefix_hash_ids=ids, hash_block_size=bs, **kw)


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 511, 512, 513, 1000, 4097])
@pytest.mark.parametrize("ids", [None, [7], [7, 8, 9]])
def test_exact_token_count(n, ids):
    assert count_tokens(render_prompt(_req(n, ids), 3)) == n


def test_words_are_single_pretokens_with_leading_space():
    for w in WORDS:
        assert w.startswith(" ") and w[1:].isalpha()
        assert count_tokens(w) == 1
    assert len(set(WORDS)) == len(WORDS) >= 300


def test_equal_ids_render_equal_prefix_and_cache_hits_as_ids_say():
    a = render_prompt(_req(2000, [1, 2, 3]), 0)
    b = render_prompt(_req(2000, [1, 2, 99]), 1)
    ta, tb = tokenize(a), tokenize(b)
    assert ta[:1024] == tb[:1024]
    assert ta[1024] != tb[1024] or ta[1024:1040] != tb[1024:1040]
    ha, hb = block_hashes(ta), block_hashes(tb)
    shared = sum(1 for x, y in zip(ha, hb) if x == y)
    assert shared == 1024 // 16
    # The simulator's id-based hashing predicts the same number of shared blocks.
    ia = block_hashes_from_ids([1, 2, 3], 512, 2000, unique=0)
    ib = block_hashes_from_ids([1, 2, 99], 512, 2000, unique=1)
    assert sum(1 for x, y in zip(ia, ib) if x == y) == shared


def test_same_ids_different_index_differ_after_ids():
    a = render_prompt(_req(1100, [5, 6]), 0)
    b = render_prompt(_req(1100, [5, 6]), 1)
    ta, tb = tokenize(a), tokenize(b)
    assert ta[:1024] == tb[:1024]
    assert ta[1024:] != tb[1024:]
    assert block_hashes(ta)[:64] == block_hashes(tb)[:64]
    assert block_hashes(ta)[64] != block_hashes(tb)[64]


def test_without_ids_prompts_share_nothing_and_are_deterministic():
    a, b = render_prompt(_req(300), 0), render_prompt(_req(300), 1)
    assert block_hashes(tokenize(a))[0] != block_hashes(tokenize(b))[0]
    assert render_prompt(_req(300), 0) == a
    # The salt moves the unique part only; shared id blocks stay shared across salts.
    assert render_prompt(_req(300), 0, salt="run2") != a
    s1 = render_prompt(_req(600, [4]), 0, salt="x")
    s2 = render_prompt(_req(600, [4]), 0, salt="y")
    assert tokenize(s1)[:512] == tokenize(s2)[:512] and s1 != s2


def test_prompt_ending_inside_an_id_block_is_a_prefix_of_the_full_block():
    short = render_prompt(_req(100, [42]), 0)
    full = render_prompt(_req(512, [42]), 1)
    assert full.startswith(short)
    assert count_tokens(short) == 100


def test_given_text_and_messages_win():
    assert render_prompt(WorkloadRequest(prompt="hi there", output_tokens=1), 0) == "hi there"
    msgs = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="why?")]
    req = WorkloadRequest(messages=msgs, output_tokens=1)
    assert render_prompt(req, 0) == "be brief\nwhy?"
    assert render_messages(req, 0) == [{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "why?"}]
    m = render_messages(_req(20), 2)
    assert len(m) == 1 and m[0]["role"] == "user" and count_tokens(m[0]["content"]) == 20


def test_render_reuses_its_id_blocks_after_warmup():
    """The hot path's cache, not a stopwatch (a timed assert fails on a busy host; the replay client's
    speed is benchmarks/replay_precision.py's): after the first render of a 32k-token prompt of 32 trace
    blocks, rendering it again under other indices draws no block's words again."""
    from tuner.workload import prompts

    req = _req(32768, list(range(32)))
    render_prompt(req, 0)
    before = prompts._id_block.cache_info()
    texts = {render_prompt(req, i) for i in range(1, 11)}
    after = prompts._id_block.cache_info()
    assert after.misses == before.misses and after.hits > before.hits
    assert len(texts) == 10   # the indices still make each prompt's unshared tail its own
