"""Speculative decoding, written once: vLLM's `--speculative-config`, what a verification step yields, and
the draft length worth proposing for the batch a knee runs at.

vLLM 0.32 takes the config as one JSON object (`SpeculativeConfig` in vllm/config/speculative.py): a
`method` (ngram, eagle, eagle3, mtp, draft_model, ...), `num_speculative_tokens` (the draft length k) and
method-specific keys (`model` for a drafter, `prompt_lookup_max` for ngram). Each step the drafter
proposes k tokens a sequence and the target model verifies all k + 1 positions in one forward pass;
the accepted prefix plus one token from the target come out.

With a per-position acceptance rate a (drafts accepted independently, the standard model of Leviathan
et al. 2023, "Fast Inference from Transformers via Speculative Decoding"), a step yields on average
E(a, k) = (1 - a^(k+1)) / (1 - a) tokens per sequence. While a step is memory-bound (small batches:
the weights are read once whatever the tokens) the k + 1 verified positions cost little more than one,
so TPOT falls by up to E. Once batch x (k + 1) tokens make the step compute-bound, every rejected
position is paid for in full and the gain turns into a loss: throughput under concurrency collapses
when k does not adapt (vLLM issue #49548).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Every `method` vLLM 0.32 accepts (`SpeculativeMethod`, without the model-specific MTP aliases).
VLLM_SPEC_METHODS = ("ngram", "ngram_gpu", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class",
                     "eagle", "eagle3", "extract_hidden_states", "mtp", "dflash", "dspark")
#: The methods the simulator costs (tuner.sim.costs); the others launch only on a real engine.
SIMULATED_METHODS = ("ngram", "eagle", "eagle3", "mtp")

#: Per-position acceptance rates assumed before a launch has measured one: priors, not measurements.
#: Prompt-lookup (ngram) drafts only hit where the output repeats the prompt (summaries, code edits, RAG
#: quotes); learned drafters (EAGLE heads, a model's own MTP layer) hit far more often on chat.
PRIOR_ACCEPTANCE = {"ngram": 0.3, "suffix": 0.3, "draft_model": 0.6, "medusa": 0.5, "mlp_speculator": 0.5,
                    "eagle": 0.6, "eagle3": 0.7, "mtp": 0.75}

#: Tokens a step can carry before it turns compute-bound on a current data-centre GPU: H100 BF16,
#: 989 TFLOP/s x 0.55 achieved / (3.35 TB/s x 0.7 achieved) ~= 230 tokens (2 FLOPs and 2 bytes per
#: weight). Used only to order the draft lengths to try first; every candidate is measured.
RIDGE_TOKENS = 232


class SpecConfig(BaseModel):
    """The part of vLLM's `SpeculativeConfig` the tuner reads; other keys pass through to vLLM as given."""

    model_config = ConfigDict(extra="allow", frozen=True)

    method: str
    num_speculative_tokens: int = Field(ge=1, strict=True)
    model: str | None = None


def parse(value: Any) -> SpecConfig:
    """A `--speculative-config` value (a JSON object string, or a mapping from a YAML file); ValueError
    with the reason when it is not one vLLM would take."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON object ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object such as {\"method\": \"ngram\", \"num_speculative_tokens\": 3}")
    method = value.get("method")
    if method not in VLLM_SPEC_METHODS and not str(method).endswith("_mtp"):
        raise ValueError(f"method {method!r} is not a vLLM speculative method "
                         f"(choose from {', '.join(VLLM_SPEC_METHODS)})")
    if not isinstance(value.get("num_speculative_tokens"), int) or isinstance(value["num_speculative_tokens"], bool) \
            or value["num_speculative_tokens"] < 1:
        raise ValueError("needs num_speculative_tokens, a whole number >= 1 (the draft length)")
    if method in ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator") and not value.get("model"):
        raise ValueError(f"method {method} needs 'model' (the drafter's weights)")
    return SpecConfig(**value)


def canonical(value: Any) -> str:
    """One spelling per config (sorted keys, no spaces), so equal configs are one knob value."""
    spec = parse(value)
    return json.dumps(spec.model_dump(exclude_none=True), sort_keys=True, separators=(",", ":"))


def check_rates(rates: dict[str, float]) -> dict[str, float]:
    """Stated per-position acceptance rates (`spec_acceptance:` of a search space or a gate file): a vLLM
    method each, a fraction 0..1 each; ValueError with the first that is not."""
    for method, rate in rates.items():
        if method not in VLLM_SPEC_METHODS:
            raise ValueError(f"{str(method)[:40]!r} is not a vLLM speculative method ({', '.join(VLLM_SPEC_METHODS)})")
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"{method}: the acceptance rate is a fraction 0..1, got {rate!r}")
    return rates


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one verification step yields per sequence on average: 1 + a + a^2 + ... + a^k."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def per_position(rate: float, k: int) -> float:
    """The per-position acceptance a (the model above) whose drafts of length `k` give vLLM's acceptance
    rate `rate` (accepted / draft tokens = (a + a^2 + ... + a^k) / k, so the same tokens per step): the
    two differ (a = 0.3 at k = 3 reads as 0.139 on vLLM's dashboard), and a measured rate used as `a`
    would undersell every draft length. Bisection: the rate rises with a from 0 to 1."""
    rate = min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if (expected_tokens(mid, k) - 1.0) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def acceptance_of(method: str, stated: dict[str, float] | None = None) -> float:
    return (stated or {}).get(method, PRIOR_ACCEPTANCE.get(method, 0.5))


def measured_acceptance(drafts: float, draft_tokens: float, accepted: float) -> tuple[float | None, float | None]:
    """(acceptance rate, mean acceptance length) from vLLM's spec-decode counters over a window, as vLLM's
    own dashboard computes them: accepted / draft tokens, and 1 + accepted / drafts."""
    if not draft_tokens or not drafts:
        return None, None
    return accepted / draft_tokens, 1.0 + accepted / drafts


def step_cost(batch: float, k: int, ridge_tokens: float = RIDGE_TOKENS) -> float:
    """A verification step's cost relative to a plain decode step at the same batch: a step is the
    weight read plus work per token, equal at the ridge (time ~ 1 + tokens / ridge), so extra positions
    cost little at a small batch and nearly their share at a large one."""
    b = max(batch, 1.0)
    return (1.0 + b * (k + 1) / ridge_tokens) / (1.0 + b / ridge_tokens)


def gain(batch: float, k: int, acceptance: float, ridge_tokens: float = RIDGE_TOKENS) -> float:
    """Expected decode speed-up of draft length `k` at `batch` sequences (below 1: a loss)."""
    return expected_tokens(acceptance, k) / step_cost(batch, k, ridge_tokens)


def order_for_batch(values: list[str], batch: float, measured: float | None = None,
                    stated: dict[str, float] | None = None) -> list[str]:
    """Speculative configs in the order to try at a knee running `batch` sequences: the largest expected
    gain first (a measured acceptance rate, where one was, else the stated rate or the method's prior).
    None is dropped: the model leaves out the KV reads, which one verification step shares between its
    k + 1 positions, so a config it scores below 1 can still gain at long contexts; the launch decides."""
    scored = []
    for v in values:
        spec = parse(v)
        a = measured if measured is not None else acceptance_of(spec.method, stated)
        scored.append((-gain(batch, spec.num_speculative_tokens, a), spec.num_speculative_tokens, v))
    return [v for _, _, v in sorted(scored)]


def candidates_for_batch(values: list, direction: str, evidence: dict, stated: dict[str, float],
                         current: Any) -> list:
    """Speculative configs in the order worth trying at the batch a knee runs at (`KnobSpec.narrow`):
    the draft length (and method) with the largest expected gain first (`order_for_batch`). The
    acceptance rate an incumbent with speculation measured is used for its own method; other methods
    take the stated rate or the prior. Unchanged where the knee's batch is not known."""
    running = evidence.get("running_p90")
    if not isinstance(running, (int, float)):
        return values
    measured = evidence.get("spec_acceptance_rate")
    rates = dict(stated)
    if isinstance(measured, float) and current:  # vLLM's rate, read back as the model's per-position a
        spec = parse(current)
        rates[spec.method] = per_position(measured, spec.num_speculative_tokens)
    specs = [v for v in values if v is not None]
    return order_for_batch(specs, running, stated=rates) + [v for v in values if v is None]


def low_concurrency(batch: float, ridge_tokens: float = RIDGE_TOKENS) -> bool:
    """Whether a knee's batch leaves room for even one draft token a sequence before the step turns
    compute-bound (batch x 2 tokens under the ridge): the regime where speculation can pay."""
    return batch * 2 <= ridge_tokens
