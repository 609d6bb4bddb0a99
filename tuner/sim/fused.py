"""Plain decode steps in a row: the simulated engine's fast path in virtual time.

Most steps of a load run only decode: no request prefills or can be admitted, none needs preempting. Each
costs `EngineCore.step`'s full scheduling pass for what is a few integer updates and one step time, and a
load run takes thousands of them; `decode_steps` runs them in one loop, with `step`'s arithmetic in its
order, so the numbers are the same to the last bit (`benchmarks/twin_rank_exact.py` and
tests/unit/test_sim_engine_fast.py compare it with one `step` call a step). It reads the engine core's
state directly: it is that core's loop, kept in its own module so the core's module stays one read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.sim.engine import EngineCore
from tuner.sim.seq import Seq


@dataclass(slots=True, eq=False)
class Sampler:
    """The caller's gauge clock (run seconds): the next sample is due at `next_t`, then every `interval`.
    `decode_steps` takes the samples that fall between its steps, as (t, running, waiting, KV
    usage) in `taken`, so that a sample does not end a run of fused steps (a burst's drain samples every
    10 ms: most of its steps)."""

    next_t: float
    interval: float
    taken: list[tuple[float, int, int, float]] = field(default_factory=list)


def decode_steps(core: EngineCore, now: float, t0: float, until_rel: float, deadline_rel: float,
                 it_tokens: list, sampler: Sampler | None = None) -> float:
    """Plain decode steps of `core` in a row, the same arithmetic as `EngineCore.step`, while no request
    prefills, none can be admitted (nothing waits, or `max_num_seqs` run) and none needs preempting (no
    speculation, no noise). Decodes that finish leave the batch as in `step` (the open loop ignores
    `step`'s list of finished requests); with LoRA the run stops before a finish instead (a finish changes
    the adapters' slots). Stops after the step whose end (`- t0`) reaches `until_rel` or passes
    `deadline_rel`, the caller's next event, or after a finish that frees a slot a waiting request could
    take; each step's tokens go to `it_tokens`, and the gauge samples due after a step it goes on from to
    `sampler` (the state the caller would have sampled: no arrival or admission comes between). Returns
    the clock after the last step (`now` when none could run)."""
    if core.prefilling or not core.n_dec or core.width != 1 or core.noise or not core.keep_step_times:
        return now
    lora, waiting, max_seqs, running = core.lora, core.waiting, core.cfg.max_num_seqs, core.running
    if waiting and (lora is not None or len(running) < max_seqs):
        return now  # `step` admits (or, with LoRA, may skip by adapter)
    phase, pool, finish_at, B = core.phase, core.pool, core.finish_at, core.block
    ends = core.step_end
    finished: list[Seq] = []  # `_finish` fills it as in `step`; the open loop does not read it
    t = core.step_idx
    n_dec = 0
    while True:
        if n_dec != core.n_dec:  # the batch's fixed costs, again after a finish (`CostModel.decode_terms`)
            n_dec = core.n_dec
            fixed, attn_pp, kv_pp, factor, ar = core.cost.decode_terms(n_dec)
            lora_s = lora.compute_time(n_dec) if lora is not None else 0.0  # no adapter enters
        if lora is not None and t in finish_at:
            break
        need = phase[(-t) % B]
        if need:
            if need <= pool.free_anon:
                pool.free_anon -= need
            elif need <= pool.free_anon + len(pool.cached_free) + pool.free_whole:
                pool.take(need)
            else:
                break  # a preemption: `step` does it
        ctx = core.dec_ctx + n_dec
        # `CostModel.step_time(0, 0.0, 0, n_dec, ctx, n_dec, 1)`, inlined in its order (same floats)
        dc, dm = ctx * attn_pp, ctx * kv_pp
        dec = dc if dc > dm else dm
        if factor:
            dec *= factor
        dur = fixed + dec
        if ar:
            dur += ar
        now = now + dur + lora_s
        ends.append(now)
        core.last_step_tokens = n_dec
        core.generation_tokens += n_dec
        core.dec_ctx = ctx
        it_tokens.append(n_dec)
        due = finish_at.pop(t, None)
        for seq, epoch in due or ():  # decodes that produced their last token (as in `step`)
            if epoch == seq.epoch and seq.decoding:
                core._stop_decoding(seq, seq.c0 + (t - seq.t0 + 1), t + 1)
                core._finish(seq, now, finished)
        t += 1
        core.step_idx = t
        rel = now - t0
        if rel >= until_rel or rel > deadline_rel or not core.n_dec:
            break
        if due and waiting and len(running) < max_seqs:
            break  # a slot is free: the next step admits
        if sampler is not None and sampler.next_t <= rel:
            usage = pool.usage
            while sampler.next_t <= rel:
                sampler.taken.append((sampler.next_t, len(running), len(waiting), usage))
                sampler.next_t += sampler.interval
    return now
