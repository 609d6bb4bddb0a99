"""The record shape of each workload format and its conversion into a `WorkloadRequest`.

Each foreign format gets its own Pydantic model so that a bad record is reported in the *file's* field names
(`output_length: must be >= 1` for a Mooncake trace, not our `output_tokens`). Foreign formats ignore keys
they do not define (real files carry ids, models, metadata); our own format is strict, because a typo in a
file we define should never be silently dropped. Reading files and detecting formats is `loader.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.tokens import count_tokens
from tuner.validation import first_error
from tuner.workload.model import WorkloadRequest

MOONCAKE_BLOCK = 512
HUMAN_ROLES = frozenset({"human", "user"})
ANSWER_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bing", "bard", "model"})
#: `model`: the OpenAI API's name of the adapter a request is served by (our `lora`, either may be given)
TUNER_ONLY_KEYS = frozenset(WorkloadRequest.model_fields) - {"prompt", "output_tokens"} | {"model"}


class RecordError(Exception):
    """One record is bad: `field` (in the file's names, may be None) and a short message."""

    def __init__(self, field: str | None, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


@dataclass
class Converted:
    """A request plus its absolute arrival (seconds on the trace's own clock), shifted to 0 by the loader."""

    request: WorkloadRequest
    t_abs: float | None = None


def _validate(model: type[BaseModel], raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise RecordError(None, f"expected a JSON object, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise RecordError(*first_error(e)) from None


# --- the project's own JSONL --------------------------------------------------------------------------


def convert_tuner(raw: Any) -> Converted:
    if isinstance(raw, dict) and "model" in raw:  # the OpenAI spelling of the adapter a request names
        raw = dict(raw)
        model = raw.pop("model")
        if "lora" in raw and raw["lora"] != model:
            raise RecordError("model", f"names adapter {model!r} but lora names {raw['lora']!r}: give one")
        raw["lora"] = model
    req = _validate(WorkloadRequest, raw)
    if req.prefix_hash_ids and req.prompt_tokens is not None:
        most = math.ceil(req.prompt_tokens / req.hash_block_size)
        if len(req.prefix_hash_ids) > most:
            raise RecordError("prefix_hash_ids", f"{len(req.prefix_hash_ids)} blocks of {req.hash_block_size} "
                                                 f"tokens are longer than prompt_tokens ({req.prompt_tokens})")
    return Converted(req, req.arrival_s)


# --- vLLM `bench serve --dataset-name custom` --------------------------------------------------------------


class VllmCustomRecord(BaseModel):
    """`{"prompt": "...", "output_tokens": 812}`: what `vllm bench serve --dataset-name custom` reads."""

    model_config = ConfigDict(extra="ignore")
    prompt: str = Field(min_length=1)
    output_tokens: int = Field(ge=1)


def convert_vllm_custom(raw: Any) -> Converted:
    # Extra keys are ignored, except our own fields: those mean the file is really ours (detection saw only
    # prompt/output_tokens on line 1), and ignoring them would silently drop lengths, ids or arrivals.
    ours = sorted(set(raw) & TUNER_ONLY_KEYS) if isinstance(raw, dict) else []
    if ours:
        raise RecordError(ours[0], "not a vllm-custom field (read as vllm-custom from the first line; "
                                   "pass --format tuner for the project's format)")
    rec = _validate(VllmCustomRecord, raw)
    return Converted(WorkloadRequest(prompt=rec.prompt, output_tokens=rec.output_tokens))


# --- ShareGPT -------------------------------------------------------------------------------------------


class ShareGPTTurn(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    speaker: str = Field(alias="from")
    value: str


class ShareGPTRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")
    conversations: list[ShareGPTTurn]


def convert_sharegpt(raw: Any) -> Converted:
    """First human turn is the prompt; the answer right after it fixes the output length.

    Output length is the answer's token count (as the simulator tokenizes), at least 1, which is how
    `vllm bench serve` replays ShareGPT with a forced length.
    """
    rec = _validate(ShareGPTRecord, raw)
    turns = rec.conversations
    h = next((i for i, t in enumerate(turns) if t.speaker.lower() in HUMAN_ROLES), None)
    if h is None:
        raise RecordError("conversations", "no human turn")
    if not turns[h].value.strip():
        raise RecordError(f"conversations.{h}.value", "empty prompt")
    if h + 1 >= len(turns) or turns[h + 1].speaker.lower() not in ANSWER_ROLES:
        raise RecordError("conversations", f"no gpt answer after the first human turn (turn {h})")
    out = max(1, count_tokens(turns[h + 1].value))
    return Converted(WorkloadRequest(prompt=turns[h].value, output_tokens=out))


# --- Azure LLM inference trace (CSV) ----------------------------------------------------------------------

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class AzureRow(BaseModel):
    model_config = ConfigDict(extra="ignore")
    TIMESTAMP: datetime
    ContextTokens: int = Field(ge=1)
    GeneratedTokens: int = Field(ge=1)


_EPOCH = datetime(1970, 1, 1)


def convert_azure(raw: Any) -> Converted:
    if isinstance(raw, dict) and isinstance(raw.get("TIMESTAMP"), str):
        try:  # Python's own parser takes the trace's 7-digit fractions; Pydantic's does not
            raw = {**raw, "TIMESTAMP": datetime.fromisoformat(raw["TIMESTAMP"].strip())}
        except ValueError:
            raise RecordError("TIMESTAMP", f"not a date-time: {raw['TIMESTAMP']!r}") from None
    row = _validate(AzureRow, raw)
    ts = row.TIMESTAMP
    t_abs = ts.timestamp() if ts.tzinfo is not None else (ts - _EPOCH).total_seconds()
    req = WorkloadRequest(prompt_tokens=row.ContextTokens, output_tokens=row.GeneratedTokens)
    return Converted(req, t_abs)


# --- Mooncake / timed trace ---------------------------------------------------------------------------------


class MooncakeRecord(BaseModel):
    """`{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}` (one id per 512 tokens)."""

    model_config = ConfigDict(extra="ignore")
    timestamp: float = Field(ge=0)
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=1)
    hash_ids: list[int] = Field(default_factory=list)


def convert_mooncake(raw: Any) -> Converted:
    rec = _validate(MooncakeRecord, raw)
    most = math.ceil(rec.input_length / MOONCAKE_BLOCK)
    if len(rec.hash_ids) > most:
        raise RecordError("hash_ids", f"{len(rec.hash_ids)} blocks of {MOONCAKE_BLOCK} tokens are longer than "
                                      f"input_length ({rec.input_length})")
    req = WorkloadRequest(prompt_tokens=rec.input_length, output_tokens=rec.output_length,
                          prefix_hash_ids=rec.hash_ids or None, hash_block_size=MOONCAKE_BLOCK)
    return Converted(req, rec.timestamp / 1000.0)


@dataclass(frozen=True)
class FormatSpec:
    name: str
    convert: Callable[[Any], Converted]
    csv: bool
    description: str


FORMATS: dict[str, FormatSpec] = {
    f.name: f for f in [
        FormatSpec("tuner", convert_tuner, False, "slo-tuner JSONL: one WorkloadRequest object per line"),
        FormatSpec("vllm-custom", convert_vllm_custom, False,
                   'vLLM bench serve custom JSONL: {"prompt": ..., "output_tokens": ...}'),
        FormatSpec("sharegpt", convert_sharegpt, False,
                   'ShareGPT JSON: [{"conversations": [{"from": "human", ...}, {"from": "gpt", ...}]}]'),
        FormatSpec("azure", convert_azure, True, "Azure LLM inference trace CSV: TIMESTAMP,ContextTokens,"
                                                 "GeneratedTokens"),
        FormatSpec("mooncake", convert_mooncake, False, 'Mooncake timed-trace JSONL: {"timestamp": ms, '
                                                        '"input_length", "output_length", "hash_ids"}'),
    ]
}

ALIASES = {"jsonl": "tuner", "vllm": "vllm-custom", "custom": "vllm-custom", "azure-csv": "azure",
           "timed-trace": "mooncake", "trace": "mooncake"}


def guess_from_record(raw: Any) -> str | None:
    """The format a first JSON record looks like, or None; keys decide, values are checked later."""
    if not isinstance(raw, dict):
        return None
    keys = set(raw)
    if "conversations" in keys:
        return "sharegpt"
    if {"timestamp", "input_length"} <= keys or {"input_length", "output_length"} <= keys:
        return "mooncake"
    if keys & TUNER_ONLY_KEYS:
        return "tuner"
    if "prompt" in keys:
        return "vllm-custom"  # {"prompt", "output_tokens"} reads the same in both; vLLM's tolerates extra keys
    return None
