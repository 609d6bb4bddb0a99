"""Capacity arithmetic computed from the profiles (REFERENCE.md section 1), never typed in."""

import pytest

from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.profiles.gpus import GIB, builtin_gpus, get_gpu
from tuner.profiles.models import builtin_models, get_model
from tuner.sim.config import resolve
from tuner.sim.costs import CostModel, CostParams


def test_qwen7b_kv_bytes_per_token_and_32k_sequence():
    m = get_model("Qwen/Qwen2.5-7B-Instruct")
    assert m.kv_bytes_per_token() == 57_344
    assert m.kv_bytes_per_token() * 32_768 / GIB == pytest.approx(1.75)
    assert m.kv_bytes_per_token() * 131_072 / GIB == pytest.approx(7.0)
    assert m.kv_bytes_per_token("fp8") == 57_344 // 2


def test_qwen7b_weights_and_decode_floor_on_4090():
    m = get_model("qwen2.5-7b")
    assert m.weight_bytes() / 1e9 == pytest.approx(15.2, abs=0.1)
    cfg = resolve(get_gpu("rtx4090"), m, Knobs())
    floor = CostModel(cfg, CostParams(bw_eff=0.70)).decode_floor()
    assert floor * 1e3 == pytest.approx(21.5, abs=0.5)


def test_awq_lowers_decode_floor():
    gpu = get_gpu("rtx4090")
    bf16 = CostModel(resolve(gpu, get_model("qwen2.5-7b"), Knobs())).decode_floor()
    awq = CostModel(resolve(gpu, get_model("qwen2.5-7b-awq"), Knobs())).decode_floor()
    fp8 = CostModel(resolve(gpu, get_model("qwen2.5-7b"), Knobs(quantization="fp8"))).decode_floor()
    assert awq < fp8 < bf16
    assert awq < 0.45 * bf16


def test_every_builtin_has_a_source_and_sane_numbers():
    assert {"rtx4090", "l40s", "a100-80gb", "h100-sxm", "h200"} <= set(builtin_gpus())
    for g in builtin_gpus().values():
        assert g.source and g.bandwidth_gbs > 500 and g.fp8_tflops >= g.bf16_tflops
    for key in ["Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct",
                "Qwen/Qwen2.5-72B-Instruct", "meta-llama/Llama-3.1-8B-Instruct",
                "meta-llama/Llama-3.1-70B-Instruct"]:
        m = builtin_models()[key]
        assert m.source
    # parameter counts match the published model sizes
    assert builtin_models()["meta-llama/Llama-3.1-8B-Instruct"].total_params / 1e9 == pytest.approx(8.03, abs=0.02)
    assert builtin_models()["meta-llama/Llama-3.1-70B-Instruct"].total_params / 1e9 == pytest.approx(70.6, abs=0.1)
    assert builtin_models()["Qwen/Qwen2.5-72B-Instruct"].total_params / 1e9 == pytest.approx(72.7, abs=0.1)
    # Qwen3's model cards: 8.2B and 32.8B parameters
    assert builtin_models()["Qwen/Qwen3-8B"].total_params / 1e9 == pytest.approx(8.2, abs=0.05)
    assert builtin_models()["Qwen/Qwen3-32B"].total_params / 1e9 == pytest.approx(32.8, abs=0.1)


def test_local_hf_config_and_user_gpu_yaml(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, '
        '"num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1000, '
        '"max_position_embeddings": 2048}')
    m = get_model(str(tmp_path))
    assert m.kv_bytes_per_token() == 2 * 2 * 2 * 32 * 2
    gy = tmp_path / "mygpu.yaml"
    gy.write_text("mygpu:\n  name: My GPU\n  memory_gib: 16\n  bandwidth_gbs: 500\n  bf16_tflops: 100\n"
                  "  fp8_tflops: 100\n  fp8_native: false\n")
    assert get_gpu(str(gy)).memory_gib == 16
    gy.write_text("mygpu:\n  name: My GPU\n  memory_gib: -1\n  bandwidth_gbs: 500\n  bf16_tflops: 1\n"
                  "  fp8_tflops: 1\n  fp8_native: false\n")
    with pytest.raises(UserError, match="memory_gib"):
        get_gpu(str(gy))
    with pytest.raises(UserError, match="unknown GPU"):
        get_gpu("tpu-v9")


def test_a_simulated_studys_commands_name_the_model_as_vllm_loads_it(tmp_path) -> None:
    """`vllm serve qwen2.5-7b` does not load on a real server: an alias is its Hugging Face id; a local
    folder or a name that is no profile's stays as given."""
    from tuner.profiles.models import hub_id

    assert hub_id("qwen2.5-7b") == hub_id("Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    assert hub_id("llama-3.1-70b").startswith("meta-llama/")
    assert hub_id(str(tmp_path)) == str(tmp_path) and hub_id("org/unknown-model") == "org/unknown-model"
