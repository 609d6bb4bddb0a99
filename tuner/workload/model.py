"""The one request record every workload format is loaded into.

Formats differ (text prompts, token counts, chat messages, timed traces with prefix hashes); the replay
client and the simulator only ever see `WorkloadRequest`, so a new format is a new loader and nothing else.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.limits import MAX_SECONDS

#: Tokens in one prompt or one output at most: beyond any model's context (10M), far below an overflow.
MAX_TOKENS = 100_000_000


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str


class WorkloadRequest(BaseModel):
    """One request of a workload.

    Either `prompt` text, `messages`, or just `prompt_tokens` (then the replay client synthesises text of
    that length). `arrival_s` is set by timed traces (seconds from the first request). `prefix_hash_ids`
    name `hash_block_size`-token blocks of the prompt: equal ids at equal positions are a shared prefix
    (the Mooncake trace convention), which is how prefix caching is judged on real reuse.
    """

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    prompt_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(ge=1, le=MAX_TOKENS)
    messages: list[ChatMessage] | None = None
    arrival_s: float | None = Field(default=None, ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)
    prefix_hash_ids: list[int] | None = None
    hash_block_size: int = Field(default=512, ge=1, le=MAX_TOKENS)
    tenant: str | None = None
    # The LoRA adapter the request is served by (its `--lora-modules` name; the OpenAI API's `model`), or
    # None for the base model. One field both sides read: the replay client sends it as `model`, the
    # simulator charges its adapter's slot and load costs.
    lora: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _has_a_prompt(self) -> "WorkloadRequest":
        if self.prompt is None and self.prompt_tokens is None and not self.messages:
            raise ValueError("needs one of prompt, prompt_tokens or messages")
        return self


class Workload(BaseModel):
    """A loaded workload: its requests in file order, and where they came from."""

    name: str
    source_format: str
    requests: list[WorkloadRequest]
    # Lines dropped by `load_workload(..., skip_invalid=True)`, each as its one-line `file:line: field: msg`
    # error, so a caller can report how much of the file was not used instead of hiding it.
    skipped: list[str] = Field(default_factory=list)

    @property
    def has_arrivals(self) -> bool:
        return bool(self.requests) and all(r.arrival_s is not None for r in self.requests)
