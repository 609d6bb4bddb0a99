"""The optional task check: the user's prompts with expected answers, greedy on the baseline and on a
candidate, and a paired test of whether the candidate is worse.

The file (`quality.tasks` in the SLO) is JSONL, one task a line: `{"prompt": "...", "expected": "..."}`
(the answer, stripped, must equal it) or `{"prompt": "...", "regex": "..."}` (the pattern must match
somewhere in the answer), optional `max_tokens` (default 64). A malformed line is a `UserError` naming
file:line, before anything is launched.

Both configurations answer the same items, so the comparison is paired: only the discordant items count
(b: the baseline right and the candidate wrong; c: the reverse). McNemar's exact test: under "no
difference" each discordant item is a fair coin, and the one-sided p-value that the candidate is worse is
P(X >= b) for X ~ Binomial(b + c, 1/2). vLLM's own CI compares GSM8K accuracy with a tolerance instead;
the paired test uses the pairing that a tolerance ignores.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import UserError
from tuner.inputs import DuplicateKey, JSONLimit, loads_json, read_text
from tuner.validation import first_error

DEFAULT_MAX_TOKENS = 64
MAX_TASKS = 10_000


class Task(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(min_length=1)
    expected: str | None = None
    regex: str | None = None
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=4096, strict=True)

    @model_validator(mode="after")
    def _one_check(self) -> "Task":
        if (self.expected is None) == (self.regex is None):
            raise ValueError("give exactly one of expected or regex")
        if self.regex is not None:
            try:
                with warnings.catch_warnings():  # Python's "possible nested set" hints are not the user's error
                    warnings.simplefilter("ignore", FutureWarning)
                    re.compile(self.regex)
            except re.error as e:
                raise ValueError(f"regex does not compile: {e}") from None
        return self

    def correct(self, answer: str) -> bool:
        if self.regex is not None:
            return re.search(self.regex, answer) is not None
        return answer.strip() == (self.expected or "").strip()


def load_tasks(path: Path) -> list[Task]:
    """Every task of the file; a malformed line is a `UserError` with file, line and field."""
    lines = read_text(path, "task file", field="quality.tasks").splitlines()
    out: list[Task] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = loads_json(line)
        except JSONLimit as e:
            raise UserError(str(e), file=str(path), line=no) from None
        except DuplicateKey as e:
            raise UserError("given twice", file=str(path), line=no, field=e.key) from None
        except json.JSONDecodeError as e:
            raise UserError(f"not JSON: {e.msg}", file=str(path), line=no) from None
        if not isinstance(raw, dict):
            raise UserError("expected a JSON object", file=str(path), line=no)
        try:
            out.append(Task.model_validate(raw))
        except ValidationError as e:
            field, msg = first_error(e)
            raise UserError(msg, file=str(path), line=no, field=field) from None
        if len(out) > MAX_TASKS:
            raise UserError(f"more than {MAX_TASKS} tasks", file=str(path), line=no)
    if not out:
        raise UserError("the task file has no tasks", file=str(path))
    return out


def mcnemar_worse(b: int, c: int) -> float:
    """One-sided exact McNemar p-value that the candidate is worse: P(X >= b), X ~ Bin(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(b, n + 1)) / 2 ** n
