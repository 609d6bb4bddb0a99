"""The `tune` command line: parses options and calls entry-point functions, nothing more.

Sub-commands live beside the code they drive (`tuner.workload.cli`, `tuner.sim.cli`, ...) and are only
registered here. `UserError` anywhere below becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer

from tuner.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Find the vllm serve configuration that serves the most traffic inside an SLO.")


def _register() -> None:
    import importlib

    for module, name in [
        ("tuner.workload.cli", "workload"),
        ("tuner.sim.cli", "sim"),
        ("tuner.study_cli", None),
        ("tuner.report.cli", None),
        ("tuner.bench.cli", None),
    ]:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:  # a sub-command not built yet
            if e.name == module:
                continue
            raise
        mod.register(app) if name is None else app.add_typer(mod.app, name=name)


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


if __name__ == "__main__":
    main()
