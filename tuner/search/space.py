"""Search spaces: which knobs the tuner may turn, to which values (the top-level `search_spaces/*.yaml`).

A knob's value `null` means "leave vLLM's default". Constraints are simple comparisons between knobs or
with numbers (`max_num_batched_tokens >= max_num_seqs`, which vLLM itself enforces), checked before a
launch so an impossible combination costs nothing.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tuner.errors import UserError
from tuner.inputs import looks_like_path, parse_yaml, read_text, yaml_line
from tuner.knobs import KNOB_SPECS as KNOB_TABLE, Knobs
from tuner.speculative import check_rates
from tuner.validation import first_error

KNOB_NAMES = tuple(Knobs.model_fields)
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
        "!=": operator.ne}
_CONSTRAINT = re.compile(r"^\s*(\w+)\s*(>=|<=|==|!=|>|<)\s*([\w.]+)\s*$")


def _builtin_dir() -> Path:
    """The built-in spaces: the top-level `search_spaces/` folder, which users read and copy. A wheel ships
    it inside the package as `tuner/search_spaces/` (`setup.py` maps it there); a checkout or an editable
    install reads the folder in place."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "search_spaces"
    return shipped if shipped.is_dir() else package.parent / "search_spaces"


BUILTIN_DIR = _builtin_dir()


class KnobValues(BaseModel):
    """One knob's candidate values in a search space (what the knob is: `tuner.knobs.KnobSpec`)."""

    model_config = ConfigDict(extra="forbid")
    values: list[Any]

    @field_validator("values")
    @classmethod
    def _non_empty(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("needs at least one value")
        return v


class SearchSpace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    description: str = ""
    knobs: dict[str, KnobValues]
    constraints: list[str] = []
    #: The GPUs of the host. With it, every configuration fills the host with data-parallel replicas
    #: (`layout`), so a study of tensor-parallel sizes compares the capacity of the whole host: TP 1 x 8
    #: replicas, TP 2 x 4 and TP 8 x 1 on one scale. The simulated engines have this many GPUs.
    host_gpus: int | None = Field(default=None, ge=1, le=4096, strict=True)
    #: Speculative decoding's per-position acceptance rate on this workload, per method (`eagle3: 0.7`):
    #: the simulated engines serve with it, and the search orders draft lengths by it until a launch has
    #: measured one (`tuner.speculative`).
    spec_acceptance: dict[str, float] = Field(default_factory=dict)

    @field_validator("spec_acceptance")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        return check_rates(v)

    @model_validator(mode="after")
    def _check(self) -> "SearchSpace":
        for k, spec in self.knobs.items():
            if k not in KNOB_NAMES:
                raise ValueError(f"unknown knob {k!r} (known: {', '.join(KNOB_NAMES)})")
            for v in spec.values:  # each value must make a valid Knobs
                bad = knob_value_error(k, v)
                if bad:
                    raise ValueError(f"{k}: bad value {v!r}: {bad}")
            if KNOB_TABLE[k].kind == "json":  # one spelling per value: a YAML mapping becomes vLLM's JSON
                spec.values = [None if v is None else getattr(Knobs(**{k: v}), k) for v in spec.values]
        for c in self.constraints:
            check_constraint(c)
        for k in self.knobs:
            low = _never_at_least(k, self.knobs)
            if low is not None:
                raise ValueError(f"{k}: bad value {low!r}: vLLM requires {k} >= {KNOB_TABLE[k].at_least}, and "
                                 f"the space's {KNOB_TABLE[k].at_least} values are all above it")
        if self.host_gpus is not None and "data_parallel_size" in self.knobs:
            raise ValueError("data_parallel_size is set from host_gpus (the host filled with replicas): "
                             "drop one of them")
        return self

    def layout(self, knobs: Knobs) -> Knobs:
        """`knobs` with the host filled: data_parallel_size = host_gpus // tensor_parallel_size (unset at
        1, vLLM's default). Without `host_gpus`, `knobs` as they are."""
        if self.host_gpus is None:
            return knobs
        dp = self.host_gpus // (knobs.tensor_parallel_size or 1)
        return knobs.with_(data_parallel_size=dp if dp > 1 else None)

    def allows(self, knobs: Knobs, defaults: dict[str, Any] | None = None) -> str | None:
        """None if `knobs` satisfies every constraint, else the first one it breaks. Unset knobs take
        `defaults` (vLLM's resolved defaults) when given, else are not checked."""
        set_knobs = knobs.set_only()
        vals = {**(defaults or {}), **set_knobs}
        for name in set_knobs:  # the rules vLLM itself enforces between knobs, from the knob table
            spec = KNOB_TABLE[name]
            if spec.matters_when is not None and not spec.matters_when(set_knobs):
                return f"{name} needs {spec.matters_when.__name__.strip('_').replace('_', ' ')}"
            other = vals.get(spec.at_least) if spec.at_least else None
            if other is not None and set_knobs[name] < other:
                return f"{name} >= {spec.at_least}"
        for c in self.constraints:
            a, op, b = _CONSTRAINT.match(c).groups()  # type: ignore[union-attr]
            left = vals.get(a)
            right = vals.get(b) if b in KNOB_NAMES else float(b)
            if left is None or right is None:
                continue
            if not _OPS[op](left, right):
                return c
        return None

    def size(self) -> int:
        """Configurations in the space before constraints (the product of the value counts), computed,
        not enumerated: a 10^7-configuration space is refused by its size, not by a MemoryError."""
        return math.prod(len(spec.values) for spec in self.knobs.values())

    def iter_grid(self) -> Iterator[Knobs]:
        """Every combination, constraints applied, one at a time (nothing held but the current one)."""
        names = list(self.knobs)
        for combo in itertools.product(*(self.knobs[n].values for n in names)):
            k = self.layout(Knobs.stored({n: v for n, v in zip(names, combo) if v is not None}))
            if self.allows(k) is None:
                yield k

    def grid(self) -> list[Knobs]:
        """Every combination (the exhaustive ground truth for benchmarks), constraints applied."""
        return list(self.iter_grid())


_NUMERIC = ("int", "tokens", "fraction")


def _never_at_least(knob: str, knobs: dict[str, KnobValues]) -> Any:
    """A value of `knob` below every value its `at_least` knob may take (vLLM's default where the space
    does not turn it): no configuration could use it (max_cpu_loras 2 where max_loras is 4 or 8)."""
    other = KNOB_TABLE[knob].at_least
    if other is None:
        return None
    default = KNOB_TABLE[other].default
    floor = [default if v is None else v for v in (knobs[other].values if other in knobs else [None])]
    floor = [v for v in floor if isinstance(v, (int, float))]
    if not floor:
        return None
    return next((v for v in knobs[knob].values if v is not None and v < min(floor)), None)


def fit_to_workload(space: SearchSpace, facts: dict[str, Any], where: str | Path
                    ) -> tuple[SearchSpace, list[str]]:
    """The space for a workload with these facts (`adapters`, `max_adapter_rank`): a value that cannot
    serve it is refused (its file and line), and the knobs it gives nothing to turn are left out (LoRA's
    knobs for a workload of one adapter or none), returned by name so the study can say so."""
    path = Path(where)
    for k, spec in space.knobs.items():
        fits = KNOB_TABLE[k].fits_workload
        for i, v in enumerate(spec.values if fits else ()):
            why = fits(v, facts)  # type: ignore[misc]
            if why:
                line = None
                if path.exists():
                    _, root = parse_yaml(read_text(path, "search space file"), path)
                    line = yaml_line(root, ["knobs", k, "values", i])
                shown = f"{v}" if v is not None else f"null (vLLM's default, {why.split(' ')[0]})"
                raise UserError(f"{shown}: {why}: vLLM would refuse to load that adapter", file=str(path)
                                if path.exists() else None, line=line,
                                field=f"knobs.{k}" if path.exists() else "--search-space")
    for k, knob in KNOB_TABLE.items():  # a knob the space leaves at vLLM's default must fit too
        why = knob.fits_workload(None, facts) if knob.fits_workload and k not in space.knobs else None
        if why:
            raise UserError(f"vLLM's default {k} {why.split(' ')[0]} {why.split(' ', 1)[1]}: add {k} to the "
                            "search space with values that hold every adapter", field="--search-space")
    dropped = [k for k in space.knobs if KNOB_TABLE[k].min_adapters > facts.get("adapters", 0)]
    if not dropped:
        return space, []
    return space.model_copy(update={"knobs": {k: v for k, v in space.knobs.items() if k not in dropped}}), dropped


def check_constraint(c: str) -> None:
    """A constraint compares a numeric knob with another numeric knob or a finite number (raises
    `ValueError` otherwise): both sides are checked here, so a typo on the right is found when the
    space is read, not as a traceback when the first configuration is checked against it."""
    if not isinstance(c, str):
        raise ValueError(f"constraint {c!r} is not a string 'knob OP knob-or-number'")
    m = _CONSTRAINT.match(c)
    if not m:
        raise ValueError(f"constraint {c!r} is not of the form 'knob OP knob-or-number'")
    left, _, right = m.groups()
    for side in (left, right):
        if side in KNOB_NAMES:
            if KNOB_TABLE[side].kind not in _NUMERIC:
                raise ValueError(f"constraint {c!r}: {side} is not a number (a {KNOB_TABLE[side].kind} knob)")
        elif side is left or not _is_number(side):
            nor = "" if side is left else " (nor a finite number)"
            raise ValueError(f"constraint {c!r}: unknown knob {side!r}{nor}")


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def knob_value_error(knob: str, value: Any) -> str | None:
    """Why `value` is not a valid value of `knob` (None: it is, or it is `null`, vLLM's default)."""
    if value is None:
        return None
    try:
        Knobs(**{knob: value})
    except ValidationError as e:
        return first_error(e)[1]
    return None


def _line_of(text: str, key: str) -> int | None:
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(rf"^\s*{re.escape(key)}\s*:", line):
            return i
    return None


def load_space(name_or_path: str | Path) -> SearchSpace:
    """A built-in space by name (`default`, `rag`, `multitenant`, ...) or a YAML file."""
    p = Path(name_or_path)
    if not p.exists() and not looks_like_path(str(name_or_path)):
        p = BUILTIN_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            known = ", ".join(sorted(f.stem for f in BUILTIN_DIR.glob("*.yaml")))
            raise UserError(f"unknown search space {str(name_or_path)!r} (built-in: {known}; or a YAML file)",
                            field="--search-space")
    text = read_text(p, "search space file", field=None if p.exists() else "--search-space")
    data, root = parse_yaml(text, p)
    if not isinstance(data, dict):
        raise UserError("expected a mapping with a 'knobs' section", file=str(p), line=1)
    knobs = data.get("knobs")
    for k, spec in (knobs or {}).items() if isinstance(knobs, dict) else ():
        values = spec.get("values") if isinstance(spec, dict) else None
        for i, v in enumerate(values if isinstance(values, list) else []):
            bad = None if k not in KNOB_NAMES else knob_value_error(k, v)
            if bad:
                raise UserError(f"bad value {v!r}: {bad}", file=str(p),
                                line=yaml_line(root, ["knobs", k, "values", i]), field=f"knobs.{k}")
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as e:
        field, msg = first_error(e)
        cons = data.get("constraints")
        hit = [i for i, c in enumerate(cons) if isinstance(c, str) and repr(c) in msg] \
            if msg.startswith("constraint ") and isinstance(cons, list) else []
        if hit:
            raise UserError(msg, file=str(p), line=yaml_line(root, ["constraints", hit[0]]),
                            field=f"constraints.{hit[0]}") from None
        unknown = re.search(r"unknown knob '(\w+)'", msg)
        key = unknown.group(1) if unknown else (field.split(".")[-1] if field else None)
        raise UserError(msg, file=str(p), line=_line_of(text, key) if key else None, field=field) from None
    return space
