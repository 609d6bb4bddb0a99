"""What the two simulated engines (in-process and HTTP) check before a study starts, written once."""

from __future__ import annotations

from typing import ClassVar, Sequence

from tuner.errors import UserError
from tuner.knobs import KNOB_SPECS
from tuner.sim.config import modelled_knobs
from tuner.sim.flags import check_extra_args


class SimulatedEngineChecks:
    """Mixed into `SimEngine` and `SimHTTPEngine`: both model the same knob values and server flags."""

    name: ClassVar[str]
    simulated: ClassVar[bool] = True

    @classmethod
    def unsupported_value(cls, values: dict[str, list]) -> tuple[str, str] | None:
        """A value vLLM accepts but the simulator does not model (`KnobSpec.simulated`), or a knob it does
        not model at all (`tuner.sim.config.modelled_knobs`): every simulated launch would refuse it."""
        for knob, vals in values.items():
            if knob not in modelled_knobs() and any(v is not None for v in vals):
                return knob, (f"{knob} is not modelled by the simulated engines (every launch would ignore "
                              "it); drop it or use --engine vllm")
            for v in vals:
                why = KNOB_SPECS[knob].unmodelled(v)
                if why:
                    return knob, why
        return None

    @classmethod
    def check_extra_args(cls, args: Sequence[str]) -> None:
        check_extra_args(args, engine=cls.name)

    @classmethod
    def needs_gpu_and_model(cls, spec) -> None:
        if not (spec.gpu and spec.model):
            raise UserError(f"--engine {cls.name} needs --gpu and --model")
