"""What the quality check keeps in the study storage: the baseline's reference and each launch's result.

Schemas only (`tuner.quality` measures; the report and the gate read these without a server). The
reference is the baseline's own greedy answers to a fixed sample of the workload's prompts and, at every
answer position, its top-k next-token log-probabilities (teacher forcing); it is the study user attribute
`quality_reference`, so a resumed study and every worker compare against the same one. A launch's
`QualityResult` travels on its `TrialRecord`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

ATTR = "quality_reference"


class PromptReference(BaseModel):
    """One sampled prompt: its token ids (truncated), the baseline's greedy answer, and the baseline's
    top-k (token id, log-probability) at each answer position, the token actually there included."""

    prompt_ids: list[int]
    answer_ids: list[int]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class QualityReference(BaseModel):
    """The baseline's answers every output-changing launch is compared with."""

    trial: int                                  # the baseline launch that answered
    knobs: dict = Field(default_factory=dict)   # its knobs: a later launch of the same is the noise floor
    top_k: int
    prompt_tokens: int                          # prompts truncated to this many tokens
    answer_tokens: int                          # N: the greedy answer's length
    simulated: bool = False                     # served by a simulator: divergences are its stated ones
    items: list[PromptReference] = Field(default_factory=list)
    seconds: float = 0.0                        # the server time the reference took (answers + logprobs)
    task_correct: list[bool] = Field(default_factory=list)   # the baseline's task answers, right or wrong


class TaskOutcome(BaseModel):
    """The optional task check (`quality.tasks`): the same prompts, greedy, on the baseline and here,
    scored against the expected answers; McNemar's exact test on the discordant pairs."""

    items: int
    baseline_correct: int
    correct: int
    only_baseline: int                          # b: the baseline right, this configuration wrong
    only_here: int                              # c: this configuration right, the baseline wrong
    p_worse: float                              # one-sided exact McNemar p-value that this is worse
    accuracy_drop: float                        # baseline accuracy - this accuracy (a fraction)


class QualityResult(BaseModel):
    """One launch's quality evidence against the baseline's reference, or why there is none."""

    #: measured: compared with the reference; reference: this launch made it (the baseline);
    #: not_measured: `reason` says why (an in-process simulator, a server without prompt logprobs, ...)
    status: Literal["measured", "reference", "not_measured"]
    reason: str | None = None
    simulated: bool = False                     # the divergences are a simulator's stated ones
    floor: bool = False                         # the baseline against itself: the noise floor
    reference_trial: int | None = None
    prompts: int = 0
    positions: int = 0                          # answer positions compared
    kl_mean: float | None = None                # nats per position, top-k + tail bucket (a lower bound)
    kl_p95: float | None = None
    top1_agreement: float | None = None         # share of positions whose most likely token is the same
    greedy_agreement: float | None = None       # share of prompts whose N-token greedy answer is the same
    greedy_prefix: float | None = None          # mean share of the answer matched before it diverges
    answer_tokens: int = 0
    tasks: TaskOutcome | None = None
    #: the SLO's quality bound this launch breaks, in words (None: within it, or no bound)
    rejected: str | None = None
    seconds: float = 0.0                        # server time the check took

    def line(self) -> str:
        """The figures in one line: 'KL 0.0031, top-1 99.2%, greedy 87% (200 prompts)'."""
        if self.status == "not_measured":
            return f"not measured ({self.reason})"
        if self.status == "reference":
            return f"reference ({self.prompts} prompts, {self.answer_tokens}-token greedy answers)"
        parts = [f"KL {self.kl_mean:.3g}", f"top-1 {100 * (self.top1_agreement or 0):.1f}%",
                 f"greedy {100 * (self.greedy_agreement or 0):.0f}%"]
        if self.tasks is not None:
            parts.append(f"task accuracy {self.tasks.correct}/{self.tasks.items} "
                         f"(baseline {self.tasks.baseline_correct})")
        tag = (", noise floor: the baseline against itself" if self.floor else "") + (
            " SIMULATED" if self.simulated else "")
        rejected = f"; REJECTED: {self.rejected}" if self.rejected else ""
        return ", ".join(parts) + f" ({self.prompts} prompts{tag}){rejected}"


def save_reference(study: Any, ref: QualityReference) -> None:
    study.set_user_attr(ATTR, ref.model_dump(mode="json"))


def load_reference(user_attrs: dict) -> QualityReference | None:
    raw = user_attrs.get(ATTR)
    return QualityReference.model_validate(raw) if raw else None
