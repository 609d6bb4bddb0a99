"""Prompt tokens counted as the model counts them (issue 13, item 3).

A model folder built here holds a real `tokenizer.json` (a small byte-level BPE trained with the
`tokenizers` library, as `tuner.testing.tiny_model` trains the CI model's) and a `config.json` with
Qwen2.5-7B's shape. Both simulators, the in-process `SimEngine` and the HTTP simulator as the sim-http
engine launches it (a real subprocess on 127.0.0.1), must count prompts exactly as `tokenizers` does on the
same text. The texts are chosen so the estimate is far off, so a simulator still estimating fails. When
TUNER_TINY_MODEL (`. .ci/env`) names the CI's real tiny model folder, the in-process check runs on it too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from tuner.engine.sim import SimEngine
from tuner.engine.sim_http import SimHTTPEngine
from tuner.knobs import Knobs
from tuner.sim.protocol import render_chat
from tuner.tokens import ESTIMATE, count_tokens, token_counter_for
from tuner.workload.model import ChatMessage, Workload, WorkloadRequest
from tuner.workload.stats import GIVEN_COUNTS, describe

tokenizers = pytest.importorskip("tokenizers")

GPU = "rtx4090"
# Qwen2.5-7B-Instruct's config.json fields the profile reads (tuner/profiles/data/models.yaml)
CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 28,
          "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
          "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768,
          "tie_word_embeddings": False, "attention_bias": True}
CORPUS = ["the quick brown fox jumps over the lazy dog", "a model counts tokens as its tokenizer does",
          "prefix caching hashes blocks of sixteen tokens", "the server streams one event per token"]
# Words the tokenizer never saw split into several pieces each; the estimate counts one per word.
TEXTS = ["Unseen vocabulary: zygomorphic xylophonist quizzically bejewelled kaleidoscopes!",
         "the quick brown fox " * 5 + "catapulted 123456 spectrophotometers, 42x faster."]


def build_model(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "tiny-bpe")


def library_count(folder: Path, text: str, special_tokens: bool = True) -> int:
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return len(tok.encode(text, add_special_tokens=special_tokens).ids)


def sim_prompt_tokens(model_ref: str, texts: list[str]) -> list[int]:
    """Prompt tokens of each text as the in-process simulator's load run records them."""
    reqs = [WorkloadRequest(prompt=t, output_tokens=2) for t in texts]
    with SimEngine(GPU, model_ref).launch(Knobs()) as server:
        run = server.run_load(reqs, [0.01 * i for i in range(len(reqs))], offered_rate=1.0)
    return [r.prompt_tokens for r in sorted(run.records, key=lambda r: r.index)]


def test_texts_are_ones_the_estimate_gets_wrong(model):
    for t in TEXTS:
        assert library_count(model, t) > count_tokens(t) + 5


@pytest.mark.parametrize("ref", ["folder", "config.json"])
def test_in_process_simulator_counts_with_the_model_tokenizer(model, ref):
    model_ref = str(model if ref == "folder" else model / "config.json")
    assert sim_prompt_tokens(model_ref, TEXTS) == [library_count(model, t) for t in TEXTS]
    assert token_counter_for(model_ref).source == f"tokens counted with {(model / 'tokenizer.json').resolve()}"
    with SimEngine(GPU, model_ref).launch(Knobs()) as server:
        assert "token counts: tokens counted with" in server.launch_log


def test_profile_name_falls_back_to_the_estimate():
    assert sim_prompt_tokens("qwen2.5-7b", TEXTS) == [count_tokens(t) for t in TEXTS]
    assert token_counter_for("qwen2.5-7b").source == ESTIMATE


def ci_tiny_model() -> Path:
    folder = Path(os.environ.get("TUNER_TINY_MODEL") or "/nonexistent")
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("TUNER_TINY_MODEL (. .ci/env) names no folder with tokenizer.json")
    return folder


@pytest.mark.parametrize("which", ["built", "ci"])
def test_http_simulator_usage_prompt_tokens_are_the_tokenizers(model, tmp_path, which):
    model = model if which == "built" else ci_tiny_model()
    engine = SimHTTPEngine(GPU, str(model), run_dir=tmp_path / "servers")
    messages = [{"role": "system", "content": TEXTS[0]}, {"role": "user", "content": TEXTS[1]}]
    with engine.launch(Knobs()) as server:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            for text in TEXTS:
                r = c.post("/v1/completions", json={"model": str(model), "prompt": text, "max_tokens": 2})
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["prompt_tokens"] == library_count(model, text)
            r = c.post("/v1/chat/completions", json={"model": str(model), "messages": messages,
                                                     "max_tokens": 2})
            assert r.status_code == 200, r.text
            # the rendered ChatML text, encoded without added special tokens as vLLM encodes a chat
            assert r.json()["usage"]["prompt_tokens"] == library_count(model, render_chat(messages), False)
        log = Path(server.info.log_path).read_text()
    assert f"token counts: tokens counted with {(model / 'tokenizer.json').resolve()}" in log


def test_workload_stats_say_which_count_was_used(model):
    w = Workload(name="t", source_format="jsonl", requests=[
        WorkloadRequest(prompt=TEXTS[0], output_tokens=2),
        WorkloadRequest(messages=[ChatMessage(role="user", content=TEXTS[1])], output_tokens=2)])
    exact = describe(w, token_counter_for(str(model)))
    assert exact.token_count.startswith("tokens counted with ") and exact.token_count.endswith("tokenizer.json")
    assert exact.total_prompt_tokens == sum(library_count(model, t) for t in TEXTS)
    est = describe(w)
    assert est.token_count == ESTIMATE and est.total_prompt_tokens == sum(count_tokens(t) for t in TEXTS)
    given = Workload(name="g", source_format="jsonl", requests=[WorkloadRequest(prompt_tokens=9, output_tokens=2)])
    assert describe(given, token_counter_for(str(model))).token_count == GIVEN_COUNTS


def test_ci_tiny_model_counts_match_its_tokenizer():
    folder = ci_tiny_model()
    texts = TEXTS + ["Hello there, general Kenobi. 3.14159 is pi?"]
    assert sim_prompt_tokens(str(folder), texts) == [library_count(folder, t) for t in texts]


def test_workload_inspect_names_the_count_it_used(model, tmp_path):
    from tests.e2e.test_workload_cli import tune

    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"prompt": t, "output_tokens": 3}) + "\n" for t in TEXTS))
    exact = tune("workload", "inspect", f, "--model", model)
    assert exact.returncode == 0, exact.stderr
    assert f"token counts: tokens counted with {(model / 'tokenizer.json').resolve()}" in exact.stdout
    total = sum(library_count(model, t) for t in TEXTS)
    assert json.loads(tune("workload", "inspect", f, "--model", model, "--json").stdout)[
        "total_prompt_tokens"] == total
    estimated = tune("workload", "inspect", f)
    assert "token counts: estimated: ~1 token per word-piece" in estimated.stdout
