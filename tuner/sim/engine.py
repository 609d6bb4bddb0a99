"""The simulated engine core: vLLM V1's scheduler driving the roofline cost model.

It knows nothing of clocks, HTTP or search: `step(now)` schedules one batch, returns how long the GPU
would take, and the caller advances whichever clock it runs on (virtual time in `virtual.py`, the wall
clock in the HTTP server). One engine core, two clocks.

Scheduling follows vLLM V1 (`vllm/v1/core/sched/scheduler.py`): every step first schedules the running
decodes, then running chunked prefills, then admits waiting requests FCFS into what is left of the
`max_num_batched_tokens` budget, never more than `max_num_seqs` running. KV lives in 16-token blocks;
when a running request needs a block and none is free, the most recently admitted request is preempted
by recompute (its blocks freed, back to the front of the queue), and no new request is admitted that
step. Prefix caching reuses a waiting request's cached prompt blocks (never the last prompt token).

Decoding sequences are tracked in aggregate (counts per block phase, summed context), so a step costs
O(prefills + finishes), not O(batch): the simulator runs far faster than the GPU it models.

Speculative decoding (`tuner.speculative`): every decode verifies k + 1 positions in the step (k + 1
tokens of the budget each, as vLLM schedules them) and the step emits g tokens a sequence, g carried so
that its mean is the expected accepted length E(a, k). The step index counts tokens, so one speculative
step spans g indices that share its end time (the accepted tokens arrive together, as vLLM streams
them). Every sequence of a step gets the same g: TPOT and throughput come out right; the spread of
acceptance between requests is not modelled.
"""

from __future__ import annotations

import math
import random
from collections import deque

from tuner.sim.config import ResolvedConfig
from tuner.sim.costs import CostModel, CostParams
from tuner.sim.kvcache import BlockPool
from tuner.sim.lora import AdapterSlots
from tuner.sim.seq import Seq
from tuner.speculative import acceptance_of, expected_tokens


__all__ = ["EngineCore", "Seq"]


class EngineCore:
    def __init__(self, cfg: ResolvedConfig, cost_params: CostParams | None = None, *, noise: float = 0.0,
                 seed: int = 0, keep_step_times: bool = True):
        self.cfg = cfg
        self.cost = CostModel(cfg, cost_params)
        self.block = cfg.block_size
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}
        self.prefilling: list[Seq] = []
        self.n_dec = 0
        self.dec_ctx = 0
        self.phase = [0] * self.block
        self.finish_at: dict[int, list[tuple[Seq, int]]] = {}
        self.step_idx = 0
        self.keep_step_times = keep_step_times
        self.step_end: list[float] = []
        self.rng = random.Random(seed)
        self.noise = noise
        self.launch_factor = math.exp(self.rng.gauss(0.0, noise)) if noise else 1.0
        # vLLM counters, cumulative since launch (same meaning as /metrics)
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.last_step_tokens = 0
        # speculative decoding: draft length, expected tokens a step, the carried fraction, vLLM's counters
        self.spec_k = cfg.spec_tokens
        self.width = self.spec_k + 1  # positions a decode verifies each step
        self.spec_yield = expected_tokens(acceptance_of(cfg.spec_method or "", dict(self.cost.params.spec_acceptance)),
                                          self.spec_k) if self.spec_k else 1.0
        self._carry = 0.0
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        # multi-LoRA: adapter slots, CPU cache, loads and the max_loras scheduling rule (`tuner.sim.lora`)
        self.lora = AdapterSlots(cfg, cfg.lora) if cfg.lora is not None else None

    # -- requests -------------------------------------------------------------------------------
    def check(self, prompt_len: int, output_len: int) -> str | None:
        """vLLM's 400 for a request that cannot fit the context window, else None."""
        limit = self.cfg.max_model_len
        if prompt_len + output_len > limit:
            return (f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{prompt_len + output_len} tokens ({prompt_len} in the messages, {output_len} in "
                    f"the completion). Please reduce the length of the messages or completion.")
        return None

    def add(self, seq: Seq) -> None:
        seq.target = seq.prompt_len
        self.waiting.append(seq)

    def abort(self, seq: Seq) -> bool:
        """Remove a request whose client went away, between steps, as vLLM aborts on disconnect: a
        waiting one is dropped, a running one gives back its blocks (cached prompt blocks stay cached).
        False when it is not in the engine (already finished, or never added)."""
        if seq.finish is not None:
            return False
        if self.running.get(seq.rid) is seq:
            seq.epoch += 1  # its pending finish_at entry is stale now
            if seq.decoding:
                t = self.step_idx  # steps t0..t-1 ran, so its KV holds c0 + (t - t0) tokens
                self._stop_decoding(seq, seq.c0 + (t - seq.t0), t)
            else:
                self.prefilling.remove(seq)
                self._release(seq, seq.computed)
            return True
        try:
            self.waiting.remove(seq)
        except ValueError:
            return False
        return True

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # -- one step -------------------------------------------------------------------------------
    def step(self, now: float, events: list | None = None) -> tuple[float, list[Seq]]:
        """Schedule and 'run' one batch starting at `now`. Returns (duration, finished sequences).
        With `events` (a list), appends every sequence that emitted a token this step.

        The phases run in vLLM's order: the running decodes, the running chunked prefills, admission;
        then the batch's cost and what it produced. The prefill phase is skipped when no prefill runs
        (most steps of a load run only decode)."""
        t = self.step_idx
        width = self.width
        g = self._accepted_now(t) if width > 1 and self.n_dec else 1
        preempted = self._schedule_decodes(t, g)
        budget = self.cfg.max_num_batched_tokens - self.n_dec * width
        chunks: list[tuple[Seq, int]] = []
        if self.prefilling:
            budget, preempted_prefills = self._schedule_prefills(t, budget, chunks)
            preempted = preempted or preempted_prefills
        # admit waiting requests FCFS (not in a step that had to preempt, as vLLM)
        if not preempted and self.waiting:
            self._admit(now, budget, chunks)

        dur, prefill_tokens, completing = self._batch_time(chunks)
        end = now + dur
        if self.keep_step_times:
            if g == 1:
                self.step_end.append(end)
            else:
                self.step_end.extend((end,) * g)
        n_dec = self.n_dec
        self.last_step_tokens = prefill_tokens + n_dec * width
        generated = self.generation_tokens
        self.generation_tokens += completing
        finished: list[Seq] = []
        self._emit_decodes(t, g, end, finished, events)
        if width > 1 and n_dec:
            self.spec_drafts += n_dec
            self.spec_draft_tokens += n_dec * self.spec_k
            self.spec_accepted += self.generation_tokens - generated - completing - n_dec
        # prefill chunks land at the step's last index: their first decode is the next step's
        for seq, n in chunks:
            self._land_chunk(seq, n, t + g - 1, end, finished, events)
        self.step_idx += g
        return dur, finished

    def _schedule_decodes(self, t: int, g: int) -> bool:
        """The running decodes take their g tokens each: a new block for those whose KV fills its last
        block, preempting from the tail while none is free. True when it preempted."""
        B = self.block
        pool = self.pool
        if g > 1:  # _accepted_now checked that these blocks are free
            pool.take(sum(self.phase[(-u) % B] for u in range(t, t + g)))
            return False
        preempted = False
        key_now = (-t) % B
        need = self.phase[key_now]
        if need:  # (the pool's num_free and take, inlined: this runs every step of every load run)
            while need > pool.free_anon + len(pool.cached_free) + pool.free_whole:
                self._preempt_tail(t, scheduled_decodes=False)
                preempted = True
                need = self.phase[key_now]
            if need <= pool.free_anon:
                pool.free_anon -= need
            else:
                pool.take(need)
        return preempted

    def _schedule_prefills(self, t: int, budget: int, chunks: list[tuple[Seq, int]]) -> tuple[int, bool]:
        """The running chunked prefills, in admission order, each its next chunk within `budget`, into
        `chunks`; preempting from the tail for the blocks a chunk needs. The budget left, and whether it
        preempted."""
        B = self.block
        pool = self.pool
        preempted = False
        for seq in list(self.prefilling):
            if budget <= 0:
                break
            if seq.rid not in self.running:
                continue  # preempted earlier in this loop
            n = min(seq.target - seq.computed, budget)
            new_blocks = -(-(seq.computed + n) // B) - seq.n_blocks
            while new_blocks > pool.num_free:
                victim, was_decoding = self._preempt_tail(t, scheduled_decodes=True)
                preempted = True
                if was_decoding:
                    budget += 1
                if victim is seq:
                    break
            if seq.rid not in self.running:
                break
            pool.take(new_blocks)
            seq.n_blocks += new_blocks
            chunks.append((seq, n))
            budget -= n
        return budget, preempted

    def _batch_time(self, chunks: list[tuple[Seq, int]]) -> tuple[float, int, int]:
        """The batch's duration on the modelled GPU (the cost model's step, the drafter, adapter loads,
        the launch's noise), its prefill tokens, and how many prefills it completes."""
        width = self.width
        prefill_tokens = 0
        pairs = 0.0
        kv_tokens = 0
        completing = 0
        for seq, n in chunks:
            c = seq.computed
            prefill_tokens += n
            pairs += n * c + n * (n + 1) / 2
            kv_tokens += c + n
            if c + n == seq.target:
                completing += 1
        n_dec = self.n_dec
        dur = self.cost.step_time(prefill_tokens, pairs, kv_tokens, n_dec, self.dec_ctx + n_dec,
                                  n_dec * width + completing, width)
        if width > 1 and n_dec:
            dur += self.cost.draft_time(self.cfg.spec_method or "", self.spec_k, n_dec, self.dec_ctx)
        if self.lora is not None:  # adapters entering the batch are loaded before its forward pass
            dur += self.lora.step_time(prefill_tokens + n_dec * width)
        if self.noise:
            dur *= self.launch_factor * math.exp(self.rng.gauss(0.0, self.noise))
        return dur, prefill_tokens, completing

    def _emit_decodes(self, t: int, g: int, end: float, finished: list[Seq], events: list | None) -> None:
        """The decodes' tokens, one step index each (t .. t+g-1), all ending at `end`; a decode that
        produced its last token leaves the aggregate and finishes."""
        B = self.block
        finish_at = self.finish_at
        for u in range(t, t + g):
            if events is not None:
                events.extend(s for s in self.running.values() if s.decoding)
            self.generation_tokens += self.n_dec
            self.dec_ctx += self.n_dec
            due = finish_at.pop(u, None)
            for seq, epoch in due or ():  # decodes that produced their last token
                if epoch == seq.epoch and seq.decoding:
                    computed = seq.c0 + (u - seq.t0 + 1)
                    self._stop_decoding(seq, computed, u + 1)
                    self._finish(seq, end, finished)
                    if g > 1:  # the blocks taken for its tokens past the last go back
                        self.pool.free_anon += sum(1 for w in range(u + 1, t + g) if (seq.key + w) % B == 0)

    def _accepted_now(self, t: int) -> int:
        """Tokens every decode emits this speculative step: the carried expectation's whole part, at
        most k + 1, and 1 where the blocks the extra tokens need are not free (that step then preempts
        as a plain one would)."""
        self._carry = min(self._carry + self.spec_yield, self.spec_k + 1.0)
        g = max(1, int(self._carry))
        if g > 1 and sum(self.phase[(-u) % self.block] for u in range(t, t + g)) > self.pool.num_free:
            g = 1
        self._carry -= g
        return g

    # -- internals ------------------------------------------------------------------------------
    def _admit(self, now: float, budget: int, chunks: list) -> None:
        B = self.block
        pool = self.pool
        caching = pool.caching
        max_seqs = self.cfg.max_num_seqs
        lora, skipped = self.lora, []
        while self.waiting and budget > 0 and len(self.running) < max_seqs:
            seq = self.waiting[0]
            if lora is not None and seq.lora >= 0 and not lora.may_schedule(seq.lora):
                skipped.append(self.waiting.popleft())  # its adapter would exceed max_loras: vLLM skips it
                continue
            n_hit, from_free = pool.match(seq.hashes, (seq.target - 1) // B) if caching else (0, 0)
            hit_tokens = n_hit * B
            if not self.cfg.enable_chunked_prefill and seq.target - hit_tokens > budget:
                break  # unchunked, a prefill is scheduled whole or waits for a step with room (vLLM's V1 scheduler)
            n = min(seq.target - hit_tokens, budget)
            new_blocks = -(-(hit_tokens + n) // B) - n_hit
            if new_blocks + from_free > pool.num_free:
                break
            if n_hit:
                held = seq.hashes[:n_hit]
                seq.pieces = pool.ref(held, from_free)
                seq.held = held
            pool.take(new_blocks)
            seq.n_blocks = n_hit + new_blocks
            seq.computed = hit_tokens
            if caching:
                self.prefix_queries += seq.target
                self.prefix_hits += hit_tokens
            if seq.first_scheduled is None:
                seq.first_scheduled = now
                seq.cached_tokens = hit_tokens
            self.waiting.popleft()
            self.running[seq.rid] = seq
            if lora is not None and seq.lora >= 0:
                lora.admitted(seq.lora)
            self.prefilling.append(seq)
            chunks.append((seq, n))
            budget -= n
        if skipped:  # back at the head of the queue, in their order
            self.waiting.extendleft(reversed(skipped))

    def _land_chunk(self, seq: Seq, n: int, t: int, end: float, finished: list, events) -> None:
        B = self.block
        old = seq.computed
        seq.computed = new = old + n
        hashes = seq.hashes
        if self.pool.caching and hashes:
            lo, hi = max(old // B, len(seq.held)), min(new // B, len(hashes))
            if hi > lo:  # the chunk's full blocks not cached yet, registered
                seq.spans = self.pool.land(seq.held, hashes, lo, hi, seq.spans)
        if new < seq.target:
            return
        # prefill complete: it samples one token
        self.prefilling.remove(seq)
        if seq.prefill_done is None:
            seq.prefill_done = end
            self.prompt_tokens += seq.prompt_len
        seq.produced += 1
        seq.steps += (t, 1)
        if seq.first_token is None:
            seq.first_token = end
        if events is not None:
            events.append(seq)
        if seq.produced >= seq.output_len:
            self._release(seq, new)
            self._finish(seq, end, finished)
            return
        seq.decoding = True
        seq.t0 = t + 1
        seq.c0 = new
        seq.key = (new - t - 1) % B
        self.phase[seq.key] += 1
        self.n_dec += 1
        self.dec_ctx += new
        fin = seq.t0 + (seq.output_len - seq.produced) - 1
        self.finish_at.setdefault(fin, []).append((seq, seq.epoch))

    def _stop_decoding(self, seq: Seq, computed: int, upto_step: int) -> None:
        """Leave the decode aggregate, crediting the tokens of steps t0..upto_step-1; free its blocks."""
        self.phase[seq.key] -= 1
        self.n_dec -= 1
        self.dec_ctx -= computed
        count = upto_step - seq.t0
        if count > 0:
            seq.steps += (seq.t0, count)
            seq.produced += count
        self._release(seq, computed)
        seq.decoding = False

    def _release(self, seq: Seq, computed: int) -> None:
        n_blocks = seq.n_blocks if not seq.decoding else -(-computed // self.block)
        self.pool.release(seq.held, n_blocks - len(seq.held), seq.pieces, seq.spans)
        seq.held = []
        seq.pieces = None
        seq.spans = None
        seq.n_blocks = 0
        if self.running.pop(seq.rid, None) is not None and self.lora is not None and seq.lora >= 0:
            self.lora.released(seq.lora)

    def _preempt_tail(self, t: int, scheduled_decodes: bool) -> tuple[Seq, bool]:
        """Preempt the most recently admitted running request (recompute), as vLLM V1 does."""
        rid, seq = self.running.popitem()
        self.running[rid] = seq  # _release pops it
        self.preemptions += 1
        seq.preemptions += 1
        seq.epoch += 1
        was_decoding = seq.decoding
        if was_decoding:
            computed = seq.c0 + (t - seq.t0)
            # step 1 of this step may already have given it a block: give that back too
            if scheduled_decodes and (seq.key + t) % self.block == 0:
                self.pool.free_anon += 1
            self._stop_decoding(seq, computed, t)
        else:
            self.prefilling.remove(seq)
            self._release(seq, seq.computed)
        seq.computed = 0
        seq.target = seq.prompt_len + seq.produced
        self.waiting.appendleft(seq)
        return seq, was_decoding

    def _finish(self, seq: Seq, end: float, finished: list) -> None:
        seq.finish = end
        self.requests_finished += 1
        finished.append(seq)

    # -- results --------------------------------------------------------------------------------
    def token_times(self, seq: Seq) -> list[float]:
        ends = self.step_end
        out: list[float] = []
        s = seq.steps
        for i in range(0, len(s), 2):
            a = s[i]
            out.extend(ends[a:a + s[i + 1]])
        return out
