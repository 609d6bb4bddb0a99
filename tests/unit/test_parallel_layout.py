"""Tensor and data parallelism in the simulator: vLLM's launch checks and messages, memory per GPU, the
all-reduce cost, replicas behind one server, and the search space filling a host with replicas."""

from __future__ import annotations

import pytest

from tuner.engine.classify import classify_failure
from tuner.engine.sim import SimEngine
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.search.space import SearchSpace
from tuner.sim.config import resolve
from tuner.sim.costs import CostModel
from tuner.workload.model import WorkloadRequest

L70 = "meta-llama/Llama-3.1-70B-Instruct"
L8 = "meta-llama/Llama-3.1-8B-Instruct"


def launch_failure(gpu: str, model: str, knobs: Knobs, host_gpus: int | None = 8) -> LaunchFailure:
    with pytest.raises(LaunchFailure) as e:
        resolve(get_gpu(gpu), get_model(model), knobs, host_gpus=host_gpus)
    return e.value


def test_a_70b_bf16_model_does_not_fit_one_80gb_gpu_and_fails_as_vllm_does():
    e = launch_failure("h100", L70, Knobs())
    assert e.kind == "oom" and "CUDA out of memory" in e.message
    assert classify_failure(e.message)[0] == "oom"


def test_attention_heads_not_divisible_by_tp_fail_with_vllms_message():
    e = launch_failure("h100", L70, Knobs(tensor_parallel_size=3))
    assert e.message == ("ValueError: Total number of attention heads (64) must be divisible by tensor "
                         "parallel size (3).")
    assert classify_failure(e.message)[0] == "bad_flag"


def test_a_layout_wider_than_the_host_fails_with_vllms_world_size_message():
    e = launch_failure("h100", L70, Knobs(tensor_parallel_size=4, data_parallel_size=4))
    assert "World size (16) is larger than the number of available GPUs (8) in this node" in e.message
    assert classify_failure(e.message)[0] == "bad_flag"
    # without a host size the layout's GPUs are taken as there
    assert resolve(get_gpu("h100"), get_model(L70), Knobs(tensor_parallel_size=8, data_parallel_size=2))


def test_more_tensor_parallelism_leaves_more_kv_cache_per_engine():
    """vLLM's documented direction (docs, "Optimization and Tuning", preemption): "Increase
    tensor_parallel_size. This approach shards model weights, so each GPU has more memory available for
    KV cache"."""
    gpu, model = get_gpu("h100"), get_model(L70)
    four = resolve(gpu, model, Knobs(tensor_parallel_size=4))
    eight = resolve(gpu, model, Knobs(tensor_parallel_size=8))
    assert eight.weight_bytes == pytest.approx(four.weight_bytes / 2)
    assert eight.kv_bytes_per_token_per_gpu == four.kv_bytes_per_token_per_gpu // 2
    assert eight.kv_cache_tokens > 2 * four.kv_cache_tokens  # twice the GPUs, and the weights' memory freed
    assert four.kv_bytes_per_token == model.kv_bytes_per_token()  # the whole model's KV per token is the same


def test_kv_heads_are_replicated_when_there_are_fewer_than_gpus():
    model = get_model(L70)  # 8 KV heads
    assert model.kv_bytes_per_token("auto", 16) == model.kv_bytes_per_token("auto", 8)


def test_tensor_parallel_decode_is_faster_and_pays_an_all_reduce_per_layer():
    gpu, model = get_gpu("h100"), get_model(L70)

    def decode(tp: int, g=gpu) -> float:
        cfg = resolve(g, model, Knobs(tensor_parallel_size=tp, max_model_len=8192))
        return CostModel(cfg).step_time(0, 0.0, 0, 32, 32 * 2000, 32)

    assert decode(8) < decode(4) < decode(2)
    # the same split over PCIe costs more than over NVLink: only the link differs
    pcie = gpu.model_copy(update={"interconnect": "pcie", "link_gbs": 25.0, "link_latency_us": 20.0})
    assert decode(4, pcie) > decode(4)
    cfg = resolve(gpu, model, Knobs(tensor_parallel_size=4, max_model_len=8192))
    cost = CostModel(cfg)
    n_ar = 2 * model.num_hidden_layers
    assert cost._ar_fixed == pytest.approx(n_ar * gpu.link_latency_us * 1e-6)


def test_tp_one_pays_no_all_reduce():
    cost = CostModel(resolve(get_gpu("h100"), get_model(L8), Knobs()))
    assert cost._ar_fixed == 0 and cost._ar_per_token == 0


def _run(engine: SimEngine, knobs: Knobs, rate: float, n: int = 400):
    reqs = [WorkloadRequest(prompt_tokens=500, output_tokens=100) for _ in range(n)]
    times = [i / rate for i in range(n)]
    with engine.launch(knobs) as server:
        return server.run_load(reqs, times, offered_rate=rate)


def test_data_parallel_replicas_share_the_load_behind_one_server():
    engine = SimEngine("h100", L8, host_gpus=8)
    one = _run(engine, Knobs(), rate=20.0)
    two = _run(engine, Knobs(data_parallel_size=2), rate=40.0)
    assert len(two.records) == 400 and sorted(r.index for r in two.records) == list(range(400))
    assert all(r.ok for r in two.records)
    # each replica sees half of twice the rate: the same latencies as one engine at the rate
    med = lambda run: sorted(r.e2el for r in run.records)[len(run.records) // 2]  # noqa: E731
    assert med(two) == pytest.approx(med(one), rel=0.1)
    # /metrics add up over the engines: both replicas' running sequences, all their tokens
    peak = lambda run: max(s.running for s in run.metrics.samples)  # noqa: E731
    assert peak(two) > 1.5 * peak(one) * 0.8
    # the same 400 requests of 100 tokens: the counter is both engines' sum, each engine did half
    assert two.metrics.counter("generation_tokens") == one.metrics.counter("generation_tokens") == 400 * 100


def test_a_space_with_host_gpus_fills_the_host_with_replicas():
    space = SearchSpace(knobs={"tensor_parallel_size": {"values": [1, 2, 4, 8]}}, host_gpus=8)
    grid = space.grid()
    assert [(k.tensor_parallel_size, k.data_parallel_size) for k in grid] == [(1, 8), (2, 4), (4, 2), (8, None)]
    assert space.layout(Knobs()).data_parallel_size == 8
    assert SearchSpace(knobs={"max_num_seqs": {"values": [8]}}).layout(Knobs()) == Knobs()


def test_a_space_cannot_fill_the_host_and_search_dp_at_once():
    with pytest.raises(ValueError, match="data_parallel_size is set from host_gpus"):
        SearchSpace(knobs={"data_parallel_size": {"values": [1, 2]}}, host_gpus=8)


def test_the_layout_knobs_render_as_vllm_flags():
    assert Knobs(tensor_parallel_size=4, data_parallel_size=2).flags() == [
        "--tensor-parallel-size", "4", "--data-parallel-size", "2"]
