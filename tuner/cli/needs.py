"""Options that act only beside another: declared once per command, beside its options, and checked
before anything runs. Without this, `--stop-replica-at` without `--real-router` or `--lora-assignment`
without `--lora-modules` was accepted and did nothing, and the user believed it had acted."""

from __future__ import annotations

from typing import Any

from tuner.errors import UserError

#: flag -> (what it needs, in words; the test on the command's parameters that it is there)
Needs = dict[str, tuple[str, Any]]


def given(ctx: Any, flag: str) -> bool:
    """Whether `flag` was set by the user (on the command line or from its environment variable)."""
    for p in ctx.command.params:
        if flag in getattr(p, "opts", ()):
            src = ctx.get_parameter_source(p.name)  # typer's own copy of click's enum: compared by name
            return getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT")
    raise KeyError(flag)  # a table naming an option the command does not have is a programming error


def check_needs(ctx: Any, needs: Needs) -> None:
    """A `UserError` naming the first option given without the option (or value) it needs."""
    for flag, (what, present) in needs.items():
        if given(ctx, flag) and not present(ctx.params):
            raise UserError(f"acts only with {what}: give it too, or drop this option", field=flag)


def flag_set(name: str):
    """The test that a boolean or valued option named `name` (its parameter name) is set."""
    return lambda params: bool(params.get(name))
