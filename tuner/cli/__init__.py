"""The `tune` command line: parses options and calls entry-point functions, nothing more.

Every command line module lives in this package, the top layer (`tests/unit/test_layers.py`): the main job
and `tune worker` (`study`), `tune report|plan|gate` (`report`), `tune bench` (`bench`), `tune workload`
(`workload`) and `tune sim serve` (`sim`, also `python -m tuner.cli.serve_sim`). They are registered here.
`UserError` anywhere below becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

from tuner.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find the vllm serve configuration that serves the most traffic inside an SLO.")


def _register() -> None:
    from tuner.cli import bench, report, sim, study, workload

    app.add_typer(workload.app, name="workload")
    app.add_typer(sim.app, name="sim")
    study.register(app)  # the main job is the app's own callback
    report.register(app)
    bench.register(app)


_register()


def _empty_argument(argv: list[str]) -> None:
    """An empty string is never a value here, and for a path it is worse than none: `Path("")` is the
    current directory, so `--out ''` made the working directory a run directory. Refused by name."""
    for i, a in enumerate(argv):
        if a.startswith("--") and a.endswith("=") and "=" not in a[:-1]:
            raise UserError("an empty value", field=a[:-1])
        if a == "":
            prev = argv[i - 1] if i > 0 else ""
            raise UserError("an empty value", field=prev) if prev.startswith("-") else \
                UserError(f"argument {i + 1} is empty")


def main() -> None:
    try:
        _empty_argument(sys.argv[1:])
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc:  # typer.Exit(code) comes back as a return value here
            sys.exit(rc)
    except UserError as e:
        print(f"error: {e.format()}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        # Usage errors (a bad option value, an unknown option): click's, or the copy typer vendors.
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            print(f"error: {e.format_message()} (see tune --help)", file=sys.stderr)
            sys.exit(e.exit_code or 2)
        if type(e).__name__ == "Exit" and hasattr(e, "exit_code"):  # typer.Exit / click Exit
            sys.exit(e.exit_code)
        raise

