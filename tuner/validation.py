"""Turn a Pydantic `ValidationError` into the one `field: message` a user can act on.

Pydantic's own text ("Input should be greater than or equal to 1") is long and names the rule, not the fix;
users of a workload or SLO file want `output_tokens: must be >= 1`, in the field names of *their* file.
Shared by the workload loaders and `tuner.slo` so every input file reports errors the same way.
"""

from __future__ import annotations

import math

from typing import Any

from pydantic import ValidationError

_TEMPLATES = {
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than_equal": "must be <= {le}",
    "less_than": "must be < {lt}",
    "missing": "missing",
    "extra_forbidden": "unknown field",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "bool_parsing": "must be true or false",
    "finite_number": "must be a finite number",
}


def _fmt_number(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


_BOUNDS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def first_error(e: ValidationError, rename: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(dotted field path, short message) of the first error; `rename` maps model names to file names.

    An unknown field comes first whatever its place: a misspelt `memory_gb` is why `memory_gib` is then
    missing, and the user must hear about the typo, not about the field they did try to give."""
    errors = e.errors()
    err = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = [rename.get(p, p) if rename and isinstance(p, str) else p for p in err["loc"]]
    field = ".".join(str(p) for p in loc) or None
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value) and err["type"] in _BOUNDS:
        # NaN fails every bound, so the bound's own words ("must be <= 1") would point the wrong way
        return field, f"must be a finite number, got {value}"
    template = _TEMPLATES.get(err["type"])
    if template is None:
        msg = err["msg"]
        # model validators raise ValueError: Pydantic prefixes "Value error, "
        msg = msg.removeprefix("Value error, ")
        return field, msg[:1].lower() + msg[1:]
    ctx = {k: _fmt_number(v) for k, v in (err.get("ctx") or {}).items()}
    return field, template.format(**ctx)
