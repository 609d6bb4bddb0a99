"""What the two simulated engines (in-process and HTTP) check before a study starts, written once."""

from __future__ import annotations

from typing import ClassVar, Sequence

from tuner.errors import UserError
from tuner.knobs import KV_CACHE_DTYPES
from tuner.sim.config import QUANT_CHOICES
from tuner.sim.flags import check_extra_args
from tuner.speculative import SIMULATED_METHODS, parse


class SimulatedEngineChecks:
    """Mixed into `SimEngine` and `SimHTTPEngine`: both model the same knob values and server flags."""

    name: ClassVar[str]
    simulated: ClassVar[bool] = True

    @classmethod
    def unsupported_value(cls, values: dict[str, list]) -> tuple[str, str] | None:
        """A value vLLM accepts but the simulator does not model: every simulated launch would refuse it."""
        for knob, modelled in (("kv_cache_dtype", KV_CACHE_DTYPES), ("quantization", QUANT_CHOICES)):
            for v in values.get(knob, []):
                if v is not None and v not in modelled:
                    return knob, (f"{v!r} is not modelled by the simulated engines (modelled: "
                                  f"{', '.join(modelled)}); drop it or use --engine vllm")
        for v in values.get("speculative_config", []):
            if v is not None and parse(v).method not in SIMULATED_METHODS:
                return "speculative_config", (f"method {parse(v).method!r} is not modelled by the simulated "
                                              f"engines (modelled: {', '.join(SIMULATED_METHODS)}); drop it "
                                              "or use --engine vllm")
        return None

    @classmethod
    def check_extra_args(cls, args: Sequence[str]) -> None:
        check_extra_args(args, engine=cls.name)

    @classmethod
    def needs_gpu_and_model(cls, spec) -> None:
        if not (spec.gpu and spec.model):
            raise UserError(f"--engine {cls.name} needs --gpu and --model")
