"""The simulator's multi-LoRA serving (tuner/sim/lora.py): the slots' memory comes out of the KV pool,
vLLM's start-up refusals, its rule that a step holds at most max_loras adapters (others are skipped, not
blocking), and the CPU cache that spares disk reads."""

from __future__ import annotations

import pytest

from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.lora.catalog import Adapter
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve
from tuner.sim.engine import EngineCore, Seq
from tuner.sim.lora import LoraSetup

GPU, MODEL = get_gpu("rtx4090"), get_model("qwen2.5-7b")
SETUP = LoraSetup.of([Adapter(f"a{i}", 16) for i in range(8)], MODEL)


def test_slots_take_their_memory_from_the_kv_pool() -> None:
    off = resolve(GPU, MODEL, Knobs())
    blocks = [resolve(GPU, MODEL, Knobs(max_loras=n), lora=SETUP).num_gpu_blocks for n in (1, 8, 32)]
    assert off.num_gpu_blocks > blocks[0] > blocks[1] > blocks[2]
    assert resolve(GPU, MODEL, Knobs(max_loras=8, max_lora_rank=32), lora=SETUP).num_gpu_blocks < blocks[1]


def test_vllms_start_up_refusals() -> None:
    with pytest.raises(LaunchFailure, match=r"max_cpu_loras \(2\) must be >= max_loras \(4\)"):
        resolve(GPU, MODEL, Knobs(max_loras=4, max_cpu_loras=2), lora=SETUP)
    big = LoraSetup.of([Adapter("big", 64)], MODEL)
    with pytest.raises(LaunchFailure, match="LoRA rank 64 is greater than max_lora_rank 16"):
        resolve(GPU, MODEL, Knobs(), lora=big)


def _run(core: EngineCore, loras: list[int]) -> tuple[int, list[Seq]]:
    base = core.step_idx * 1000
    seqs = [Seq(rid=base + i, arrival=0.0, prompt_len=64, output_len=20, hashes=[], lora=a) for i, a in enumerate(loras)]
    for s in seqs:
        core.add(s)
    now, most = 0.0, 0
    while core.has_work():
        dur, _ = core.step(now)
        now += dur
        most = max(most, len(core.lora.running) if core.lora else 0)
    return most, seqs


def test_a_step_holds_at_most_max_loras_adapters_and_skips_the_others() -> None:
    cfg = resolve(GPU, MODEL, Knobs(max_loras=2), lora=SETUP)
    most, seqs = _run(EngineCore(cfg), [0, 1, 2, 0, 3, 1])
    assert most == 2
    # request 3 (adapter 0, running) is admitted past request 2 (adapter 2, waiting for a slot)
    assert seqs[3].first_scheduled < seqs[2].first_scheduled
    assert all(s.finish is not None for s in seqs)


def test_the_cpu_cache_spares_disk_reads() -> None:
    loads = {}
    for cpu in (1, 8):
        core = EngineCore(resolve(GPU, MODEL, Knobs(max_loras=1, max_cpu_loras=cpu), lora=SETUP))
        for a in [0, 1, 2, 0, 1, 2, 0, 1, 2]:  # one request at a time: each change of adapter is a load
            _run(core, [a])
        assert core.lora is not None
        loads[cpu] = (core.lora.gpu_loads, core.lora.disk_loads)
    assert loads[1][0] == loads[8][0] == 9     # one slot: every change of adapter is a copy into it
    assert loads[1][1] == 9 and loads[8][1] == 3  # a big enough CPU cache reads each adapter once
