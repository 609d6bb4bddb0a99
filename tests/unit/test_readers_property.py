"""Every file reader against hostile bytes (issue 60), property-based: each reader, given a real file of its
kind with bytes replaced, cut or inserted, or bytes of no kind at all, either reads it or raises a
`UserError` (the one-line, exit-2 refusal), never another exception; and the file is never written.

Bounded in time: a fixed number of examples per reader, no deadline per example (a busy CI host is slow,
not wrong), derandomized so a run is the same run every time.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.errors import UserError
from tuner.gate.file import load_gate
from tuner.inputs import safetensors_header
from tuner.lora.catalog import read_adapter_folder, read_lora_dir
from tuner.profiles.gpus import load_gpu_file
from tuner.profiles.models import load_hf_config
from tuner.quality.tasks import load_tasks
from tuner.search.space import load_space
from tuner.slo import load_slo
from tuner.workload.loader import load_workload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 300
CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_attention_heads": 9,
          "num_key_value_heads": 3, "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152,
          "max_position_embeddings": 8192, "torch_dtype": "float32"}
HEADER = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()


def _adapter(config: Path) -> object:
    """One PEFT adapter folder: the config under test beside weights of rank 8."""
    header = json.dumps({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight":
                         {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]}}).encode()
    (config.parent / "adapter_model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(128))
    return read_adapter_folder(config.parent)


ADAPTER_CONFIG = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA",
                  "base_model_name_or_path": "m", "task_type": "CAUSAL_LM"}


def _first_lines(path: Path, n: int = 12) -> bytes:
    return b"".join(path.read_bytes().splitlines(keepends=True)[:n])


# (name, file name to write, a valid file's bytes, how to read it)
READERS: list[tuple[str, str, bytes, Callable[[Path], object]]] = [
    ("workload-jsonl", "w.jsonl", _first_lines(ROOT / "workloads/chat.jsonl"), load_workload),
    ("workload-csv", "w.csv", _first_lines(ROOT / "workloads/azure_conv_excerpt.csv"), load_workload),
    ("slo", "s.slo.yaml", (ROOT / "workloads/chat.slo.yaml").read_bytes(), load_slo),
    ("space", "space.yaml", (ROOT / "tests/fixtures/tune/space2.yaml").read_bytes(), load_space),
    ("gate", "gate.yaml", (ROOT / "reports/chat-rtx4090-qwen2.5-7b/gate.yaml").read_bytes(), load_gate),
    ("tasks", "t.jsonl", _first_lines(ROOT / "workloads/tasks/smollm2.jsonl", 4), load_tasks),
    ("lora-catalog", "cat.yaml", (ROOT / "workloads/multitenant-lora.adapters.yaml").read_bytes()[:600],
     read_lora_dir),
    ("model-config", "config.json", json.dumps(CONFIG, indent=1).encode(), load_hf_config),
    ("safetensors", "m.safetensors", len(HEADER).to_bytes(8, "little") + HEADER + bytes(16), safetensors_header),
    ("gpu-profile", "g.gpu.yaml", (ROOT / "benchmarks/data/cpu-2core.gpu.yaml").read_bytes(), load_gpu_file),
    ("adapter-config", "adapter_config.json", json.dumps(ADAPTER_CONFIG, indent=1).encode(), _adapter),
]


@st.composite
def damaged(draw, valid: bytes) -> bytes:
    """`valid` with a few bytes replaced, a slice cut out or inserted, or cut short; or arbitrary bytes."""
    kind = draw(st.sampled_from(["replace", "cut", "insert", "truncate", "random"]))
    if kind == "random" or not valid:
        return draw(st.binary(max_size=512))
    data = bytearray(valid)
    at = draw(st.integers(0, len(data) - 1))
    if kind == "replace":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif kind == "cut":
        del data[at:at + draw(st.integers(1, 64))]
    elif kind == "insert":
        data[at:at] = draw(st.sampled_from([b"\x00", b"\xff\xfe", b"\x1b", b"{", b"[" * 50, b": :", b"\n-",
                                            b"9" * 40, b"NaN", b"\xc3(", b"\t", b"\r"]))
    else:
        del data[at:]
    return bytes(data)


@pytest.mark.parametrize("name,filename,valid,read", READERS, ids=[r[0] for r in READERS])
def test_a_damaged_file_is_read_or_refused_in_one_line_and_never_written(tmp_path: Path, name: str, filename: str,
                                                                         valid: bytes, read) -> None:
    path = tmp_path / filename
    path.write_bytes(valid)
    read(path)  # the undamaged file reads: the damage below is what a refusal answers

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=damaged(valid))
    def check(data: bytes) -> None:
        path.write_bytes(data)
        before = hashlib.sha256(data).hexdigest()
        try:
            read(path)
        except UserError as e:
            text = str(e)
            assert text and "\n" not in text.strip(), text
            assert "Traceback" not in text
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before, f"{name}: the reader wrote its input"

    check()
