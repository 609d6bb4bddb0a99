"""One request inside the simulated engine (`tuner.sim.engine.EngineCore`): its lengths, its progress through
the scheduler, its KV blocks and the times it was scheduled, produced its first token and finished.

Its own module so that the engine core and its fast paths (`tuner.sim.fused`) share it without the core's
module growing past what one reads at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Seq:
    """One request inside the engine. Times are on the caller's clock; `steps` lists the engine steps
    that emitted its tokens as flat (first_step, count) pairs."""

    rid: int
    arrival: float
    prompt_len: int
    output_len: int
    hashes: list[int]
    produced: int = 0
    computed: int = 0
    target: int = 0
    held: list[int] = field(default_factory=list)
    pieces: list | None = None  # the pieces `held` holds whole, one an aligned window (`tuner.sim.kvcache.BlockPool.ref`)
    spans: list | None = None  # the spans of its fresh blocks in `held` (`tuner.sim.kvcache.BlockPool.land`)
    n_blocks: int = 0
    decoding: bool = False
    t0: int = 0
    c0: int = 0
    key: int = 0
    epoch: int = 0
    first_scheduled: float | None = None
    first_token: float | None = None
    prefill_done: float | None = None
    finish: float | None = None
    steps: list[int] = field(default_factory=list)
    preemptions: int = 0
    cached_tokens: int = 0
    error: str | None = None
    payload: object = None
    lora: int = -1  # the adapter's index in the server's `LoraSetup` (-1: the base model)
