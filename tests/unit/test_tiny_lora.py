"""The tiny LoRA adapters are what vLLM's loader reads: PEFT's config keys and tensor names, the shapes of
the tiny model's projections, and a valid safetensors file (read back here with a reader of the format's
own layout, since the tuner's venv has no safetensors package)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tuner.testing.tiny_lora import build_adapter, build_adapters, main

CONFIG = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2}


def _read_safetensors(path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F16"
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f2").reshape(h["shape"])
    assert max(h["data_offsets"][1] for h in header.values()) == len(data)
    return out


@pytest.fixture
def base(tmp_path):
    d = tmp_path / "base"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def test_adapter_has_peft_names_and_the_models_shapes(base, tmp_path):
    out = build_adapter(base, tmp_path / "a", rank=8, seed=3)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], cfg["peft_type"], cfg["bias"]) == (8, 16, "LORA", "none")
    assert cfg["base_model_name_or_path"] == str(base.resolve())
    tensors = _read_safetensors(out / "adapter_model.safetensors")
    assert len(tensors) == 2 * 2 * 7  # layers x modules x (A, B)
    q_a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
    k_b = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
    down_a = tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
    assert q_a.shape == (8, 128) and k_b.shape == (64, 8) and down_a.shape == (8, 256)
    assert np.abs(k_b).max() > 0  # B is not zero: the adapter changes the model's output


def test_adapters_differ_by_seed_and_repeat_exactly(base, tmp_path):
    made = build_adapters(base, tmp_path / "x", count=3, rank=1)
    assert list(made) == ["lora-00", "lora-01", "lora-02"]
    again = build_adapters(base, tmp_path / "y", count=3, rank=1)
    blob = [(p / "adapter_model.safetensors").read_bytes() for p in made.values()]
    assert blob[0] != blob[1]
    assert blob[0] == (again["lora-00"] / "adapter_model.safetensors").read_bytes()


def test_cli_refuses_a_folder_without_a_model(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
