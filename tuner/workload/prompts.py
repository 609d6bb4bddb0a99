"""Turn a `WorkloadRequest` into the text (or chat messages) the replay client sends.

Most traces give only token counts, so text must be synthesised. Two properties matter and shape the code:

- Length: a real server must see about `prompt_tokens` tokens. Text is built from common English words
  with a leading space (" the", " people"), which GPT-2, Llama-3 and Qwen BPE vocabularies keep as one
  token each and never merge across words, and which `tuner.tokens.count_tokens` (the estimate)
  counts as exactly one token each. The text does not adapt to a tokenizer: it hits N exactly for one that
  keeps every word whole, and is longer for one that splits some. Measured with
  `benchmarks/token_counts.py` on the CI tiny model's tokenizer.json (vocabulary 3,274, trained on these
  words): `synth --kind chat` prompts, mean 509 tokens asked, are 509.3 real tokens (estimate 509.3) as
  completions text and 520.3 (estimate 523.3) as ChatML chat messages. The estimate is far off on other
  text: vLLM-bench random prompts of 128 / 512 / 2048 real tokens (decoded random token ids) estimate
  to 52 / 302 / 1008. With `--model` a local folder holding tokenizer.json, the simulators count the
  text with that tokenizer (`tuner.tokens.token_counter_for`), so they see what vLLM would.
- Reuse: a trace's `prefix_hash_ids` say which `hash_block_size`-token blocks are shared. Block k's words
  are drawn from a generator seeded by its id, so equal ids render equal text at equal positions and a
  prefix cache (vLLM's or the simulator's, both hashing chained 16-token blocks) hits exactly as the trace
  says. Everything past the ids is drawn from a generator seeded by the request's index (and a salt), so it
  is shared with no other request: otherwise the cache would report reuse the trace never had.

Rendering is on the replay client's hot path (thousands of prompts per run), so id blocks are cached and
words are drawn with numpy rather than per-word Python calls.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from tuner.workload.model import WorkloadRequest

# Common English words, each one BPE token with its leading space in GPT-2/Llama-3/Qwen vocabularies.
_WORDS_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an had
they you were their one all we can her has there been if more when will would who so no she other its time
people year way day man thing woman life child world school state family student group country problem hand
part place case week company system program question work government number night point home water room
mother area money story fact month lot right study book eye job word business issue side kind head house
service friend father power hour game line end member law car city community name president team minute
idea kid body information back parent face level office door health person art war history party result
change morning reason research girl guy moment air teacher force education food music table road river
light story market price land field sea tree fire paper wall window garden street church town village
plan line long great little own old big high small large next early young important few public bad same
able new good first last other different best better sure free real full special easy clear recent late
hard major strong possible whole certain low open social local short true simple single human local
make know take see come think look want give use find tell ask work seem feel try leave call keep let
begin help show hear play run move live believe bring happen write provide sit stand lose pay meet
include continue set learn change lead understand watch follow stop create speak read allow add spend
grow open walk win offer remember love consider appear buy wait serve die send expect build stay fall
cut reach kill remain suggest raise pass sell require report decide pull also just only very well even
still never here now then often always again back away today together already almost enough quite
rather really soon later perhaps maybe about after before over under between through during without
again around against among into across along behind beyond upon within toward since while where why how
what because though although until unless whether each every both either neither many much most some
any several such own same another black white red green blue brown dark bright warm cold hot cool dry
wet deep wide narrow heavy light quiet loud fast slow rich poor happy sad young old north south east west
""".split()
WORDS: tuple[str, ...] = tuple(dict.fromkeys(" " + w for w in _WORDS_TEXT))
_WORD_ARRAY = np.array(WORDS, dtype=object)


def _seed(*parts: object) -> int:
    """A process-independent 64-bit seed (Python's `hash` of str is salted per process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _words(seed: int, n: int) -> str:
    if n <= 0:
        return ""
    idx = np.random.default_rng(seed).integers(0, len(WORDS), n)
    return "".join(_WORD_ARRAY[idx])


@lru_cache(maxsize=4096)
def _id_block(hash_id: int, size: int) -> str:
    """The text of one trace hash block: depends only on the id and the block size."""
    return _words(_seed("block", hash_id, size), size)


@lru_cache(maxsize=4096)
def _id_block_prefix(hash_id: int, size: int, n: int) -> str:
    """The first `n` words of an id block (a prompt may end inside its last block)."""
    block = _id_block(hash_id, size)
    # Every word starts with exactly one space, so the n-th space marks the cut.
    pos = -1
    for _ in range(n + 1):
        pos = block.find(" ", pos + 1)
        if pos < 0:
            return block
    return block[:pos]


def synthesize_prompt(prompt_tokens: int, index: int, *, prefix_hash_ids: list[int] | None = None,
                      hash_block_size: int = 512, salt: int | str = 0) -> str:
    """Text of exactly `prompt_tokens` simulator tokens; see the module docstring for the reuse rule."""
    parts: list[str] = []
    remaining = prompt_tokens
    for hash_id in prefix_hash_ids or ():
        if remaining <= 0:
            break
        if remaining >= hash_block_size:
            parts.append(_id_block(hash_id, hash_block_size))
            remaining -= hash_block_size
        else:
            parts.append(_id_block_prefix(hash_id, hash_block_size, remaining))
            remaining = 0
    if remaining > 0:
        parts.append(_words(_seed("unique", salt, index), remaining))
    return "".join(parts)


def request_text(req: WorkloadRequest) -> str | None:
    """The text a completions request of `req` carries when the workload gives text: its prompt, else its
    messages' contents joined by newlines; None when only token counts are given. The replay client sends
    this, and the in-process simulator and the workload statistics count it, so all three agree."""
    if req.prompt is not None:
        return req.prompt
    if req.messages:
        return "\n".join(m.content for m in req.messages)
    return None


def render_prompt(req: WorkloadRequest, index: int, *, salt: int | str = 0) -> str:
    """The completion prompt for request `index` of a workload.

    Given text wins (`prompt`, else the messages' contents joined by newlines); otherwise the prompt is
    synthesised from `prompt_tokens`. `salt` changes only the request-unique part, so repeated load runs
    against one server do not hit each other's cached blocks while shared trace prefixes still do.
    """
    text = request_text(req)
    if text is not None:
        return text
    assert req.prompt_tokens is not None  # guaranteed by WorkloadRequest's validator
    return synthesize_prompt(req.prompt_tokens, index, prefix_hash_ids=req.prefix_hash_ids,
                             hash_block_size=req.hash_block_size, salt=salt)


def render_messages(req: WorkloadRequest, index: int, *, salt: int | str = 0) -> list[dict]:
    """Chat messages for `/v1/chat/completions`: the given ones, else one user message with the prompt."""
    if req.messages:
        return [m.model_dump() for m in req.messages]
    return [{"role": "user", "content": render_prompt(req, index, salt=salt)}]
