"""How far a configuration's next-token distributions moved from the baseline's: the arithmetic alone.

A server returns only the top k log-probabilities at each position (vLLM: `prompt_logprobs`, at most
`--max-logprobs`, 20 by default), plus the token actually there. The KL divergence is therefore taken over
a coarsened vocabulary: each token both servers listed is its own outcome, and everything else is one tail
bucket holding the rest of the mass (1 - the listed mass) on each side. Merging outcomes never increases a
KL divergence (the data-processing inequality), so the figure is a lower bound of the true KL(baseline ||
candidate) per position; llama.cpp's `--kl-divergence` reports the full-vocabulary mean of the same quantity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: the smallest probability a tail bucket is given (a server that listed nearly all mass: log(0) guard)
TAIL_FLOOR = 1e-12


def position_kl(base: dict[int, float], cand: dict[int, float]) -> float:
    """KL(base || cand) in nats over the tokens both listed plus one tail bucket; `base`, `cand`: token id
    -> log-probability at one position."""
    common = [t for t in base if t in cand]
    kl = 0.0
    p_listed = q_listed = 0.0
    for t in common:
        p, q = math.exp(base[t]), math.exp(cand[t])
        p_listed += p
        q_listed += q
        if p > 0:
            kl += p * (base[t] - cand[t])
    p_tail = max(1.0 - p_listed, TAIL_FLOOR)
    q_tail = max(1.0 - q_listed, TAIL_FLOOR)
    kl += p_tail * math.log(p_tail / q_tail)
    return max(kl, 0.0)  # rounding of the listed mass can leave a tiny negative


def top1(logprobs: dict[int, float]) -> int:
    """The most likely token listed (the lowest id among exact ties, so ties are read the same way)."""
    return min(logprobs, key=lambda t: (-logprobs[t], t))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Divergence:
    """Running totals over prompts: per-position KL and top-1 agreement, per-prompt greedy agreement."""

    kls: list[float] = field(default_factory=list)
    top1_same: int = 0
    answers: int = 0
    answers_same: int = 0
    prefix_shares: list[float] = field(default_factory=list)

    def add_positions(self, base: list[dict[int, float]], cand: list[dict[int, float]]) -> None:
        """One prompt's answer positions, teacher-forced on the baseline's answer (same length)."""
        for b, c in zip(base, cand):
            self.kls.append(position_kl(b, c))
            self.top1_same += top1(b) == top1(c)

    def add_answer(self, base: list[int], cand: list[int]) -> None:
        """One prompt's greedy answers, the baseline's and this configuration's."""
        n = max(len(base), 1)
        self.answers += 1
        self.answers_same += base == cand
        self.prefix_shares.append(common_prefix(base, cand) / n)

    def summary(self) -> dict[str, float | int | None]:
        kls = sorted(self.kls)
        n = len(kls)
        return {
            "positions": n,
            "kl_mean": sum(kls) / n if n else None,
            "kl_p95": kls[min(n - 1, int(math.ceil(0.95 * n)) - 1)] if n else None,
            "top1_agreement": self.top1_same / n if n else None,
            "greedy_agreement": self.answers_same / self.answers if self.answers else None,
            "greedy_prefix": sum(self.prefix_shares) / len(self.prefix_shares) if self.prefix_shares else None,
        }
