"""The LoRA adapter catalog (`--lora-dir`), the adapters a workload names, their popularity, and the four
LoRA knobs as the knob table and the search space read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.knobs import KNOB_SPECS, Knobs, answering
from tuner.lora.catalog import check_workload_adapters, read_lora_dir
from tuner.lora.popularity import Popularity, adapter_summary, working_set, zipf_weights
from tuner.search.space import SearchSpace, fit_to_workload
from tuner.workload.loader import load_workload
from tuner.workload.model import WorkloadRequest
from tuner.workload.synth import synthesize


def blob(size: int, header: dict | None = None) -> bytes:
    """A safetensors file of `size` bytes: its header (8 bytes of length, then JSON), then zeros."""
    head = json.dumps(header or {}).encode()
    return len(head).to_bytes(8, "little") + head + b"\0" * max(0, size - 8 - len(head))


def make_adapter(root: Path, name: str, rank: int = 8, weights: bytes = blob(4096), config: bool = True) -> Path:
    d = root / name
    d.mkdir(parents=True)
    if config:
        (d / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 16, "peft_type": "LORA",
                                                           "target_modules": ["q_proj", "v_proj"]}))
    (d / "adapter_model.safetensors").write_bytes(weights)
    return d


def test_a_folder_of_adapter_folders_reads_as_vllm_loads_them(tmp_path: Path) -> None:
    make_adapter(tmp_path, "alice", rank=8)
    make_adapter(tmp_path, "bob", rank=32, weights=blob(100))
    cat = read_lora_dir(tmp_path)
    assert [a.name for a in cat.adapters] == ["alice", "bob"]
    assert cat.by_name["bob"].rank == 32 and cat.by_name["bob"].bytes == 100
    assert cat.by_name["alice"].target_modules == ("q_proj", "v_proj")
    assert cat.max_rank == 32 and cat.has_paths
    assert cat.lora_modules() == [f"alice={tmp_path.resolve() / 'alice'}", f"bob={tmp_path.resolve() / 'bob'}"]


def test_an_adapter_folder_without_its_config_is_named(tmp_path: Path) -> None:
    make_adapter(tmp_path, "alice")
    make_adapter(tmp_path, "broken", config=False)
    with pytest.raises(UserError, match=r"broken: --lora-dir: adapter folder without adapter_config.json"):
        read_lora_dir(tmp_path)


def test_a_names_only_catalog_gives_two_adapters_one_name_with_its_line(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("rank: 16\nadapters:\n  - a\n  - {name: b, rank: 64}\n  - a\n")
    with pytest.raises(UserError) as e:
        read_lora_dir(p)
    assert e.value.line == 5 and "two adapters named 'a'" in e.value.message
    p.write_text("rank: 16\nadapters:\n  - a\n  - {name: b, rank: 64}\n")
    cat = read_lora_dir(p)
    assert cat.by_name["a"].rank == 16 and cat.by_name["b"].rank == 64 and not cat.has_paths


def test_an_adapter_config_that_is_a_directory_says_so(tmp_path: Path) -> None:
    (tmp_path / "ad" / "t1" / "adapter_config.json").mkdir(parents=True)
    (tmp_path / "ad" / "t1" / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="is a directory, not the adapter's config file") as e:
        read_lora_dir(tmp_path / "ad")
    assert str(e.value.file).endswith("adapter_config.json")


def test_a_bad_adapter_name_is_quoted_short_however_long_it_is(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("adapters:\n  - ok\n  - " + "x" * 10_000 + "\n")
    with pytest.raises(UserError) as e:
        read_lora_dir(p)
    line = e.value.format()
    assert e.value.line == 3 and "10,000 characters" in line and len(line) < 300, line


def test_a_workload_naming_an_adapter_not_in_the_catalog_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("adapters: [a, b]\n")
    reqs = [WorkloadRequest(prompt_tokens=10, output_tokens=5, lora="a"),
            WorkloadRequest(prompt_tokens=10, output_tokens=5, lora="zed")]
    with pytest.raises(UserError, match=r"request 2 names adapter 'zed', which is not in --lora-dir"):
        check_workload_adapters(reqs, read_lora_dir(p), "w.jsonl")
    with pytest.raises(UserError, match="pass --lora-dir"):
        check_workload_adapters(reqs, None, "w.jsonl")


def test_the_openai_model_field_is_the_adapter(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    p.write_text('{"prompt": "hi", "output_tokens": 4, "model": "alice"}\n{"prompt": "yo", "output_tokens": 4}\n')
    w = load_workload(p)
    assert w.source_format == "tuner" and [r.lora for r in w.requests] == ["alice", None]
    p.write_text('{"prompt": "hi", "output_tokens": 4, "model": "alice", "lora": "bob"}\n')
    with pytest.raises(UserError, match="model: names adapter 'alice' but lora names 'bob'"):
        load_workload(p)


def test_zipf_popularity_deciles_and_working_set() -> None:
    w = synthesize("multitenant-lora", 3000, seed=1, adapters=100, alpha=1.0)
    assert w == synthesize("multitenant-lora", 3000, seed=1, adapters=100, alpha=1.0)
    pop = Popularity.of(w.requests)
    assert pop.counts[0][0] == "lora-000"  # rank 1 is the most popular
    assert len(pop.hot) == len(pop.cold) == 10 and not pop.hot & pop.cold
    assert abs(zipf_weights(100, 1.0)[0] - 1 / sum(1 / k for k in range(1, 101))) < 1e-12
    # more requests in flight name more distinct adapters, never more than there are
    ws = [working_set(pop, k) for k in (1, 4, 16, 64, 1000)]
    assert ws == sorted(ws) and abs(ws[0] - 1.0) < 1e-9 and ws[-1] <= pop.adapters
    s = adapter_summary(w.requests, rate=20, latency_s=0.5)
    assert s is not None and s["hot_decile_share"] > 0.4 > s["cold_decile_share"]
    assert adapter_summary(synthesize("chat", 10).requests) is None


def test_the_four_lora_knobs_come_from_the_knob_table() -> None:
    k = Knobs(max_loras=4, max_lora_rank=32, max_cpu_loras=8, fully_sharded_loras=True)
    assert k.flags() == ["--max-loras", "4", "--max-lora-rank", "32", "--max-cpu-loras", "8",
                         "--fully-sharded-loras"]
    with pytest.raises(ValueError, match="not a vLLM 0.32 choice"):
        Knobs(max_lora_rank=24)
    assert answering("adapter_slots") == (["max_loras", "max_cpu_loras"], {"max_loras": "up", "max_cpu_loras": "up"})
    assert KNOB_SPECS["max_loras"].default == 1 and KNOB_SPECS["max_lora_rank"].default == 16


def test_the_space_keeps_vllms_rules_between_lora_knobs(tmp_path: Path) -> None:
    space = SearchSpace(knobs={"max_loras": {"values": [1, 4, 8]}, "max_cpu_loras": {"values": [None, 8, 32]},
                               "fully_sharded_loras": {"values": [False, True]}})
    grid = space.grid()
    assert all((k.max_cpu_loras or 99) >= (k.max_loras or 1) for k in grid)
    assert not any(k.fully_sharded_loras for k in grid)  # no tensor parallelism: nothing to shard
    with pytest.raises(ValueError, match="max_cpu_loras: bad value 2: vLLM requires max_cpu_loras >= max_loras"):
        SearchSpace(knobs={"max_loras": {"values": [4, 8]}, "max_cpu_loras": {"values": [2, 16]}})


def test_a_space_fits_the_workloads_adapters(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("knobs:\n  max_num_seqs: {values: [64, 128]}\n  max_loras: {values: [1, 4]}\n"
                 "  max_lora_rank: {values: [16, 32, 64]}\n")
    space = SearchSpace(knobs={"max_num_seqs": {"values": [64, 128]}, "max_loras": {"values": [1, 4]},
                               "max_lora_rank": {"values": [16, 32, 64]}})
    fitted, dropped = fit_to_workload(space, {"adapters": 100, "max_adapter_rank": 16}, p)
    assert fitted is space and dropped == []
    with pytest.raises(UserError) as e:
        fit_to_workload(space, {"adapters": 100, "max_adapter_rank": 32}, p)
    assert e.value.line == 4 and e.value.field == "knobs.max_lora_rank" and "below the largest adapter's rank (32)" \
        in e.value.message
    # one adapter: no LoRA knob is turned
    fitted, dropped = fit_to_workload(space, {"adapters": 1, "max_adapter_rank": 16}, p)
    assert dropped == ["max_loras", "max_lora_rank"] and list(fitted.knobs) == ["max_num_seqs"]
    # vLLM's default rank (16) cannot hold a rank-64 adapter: the space must turn max_lora_rank
    with pytest.raises(UserError, match="vLLM's default max_lora_rank 16 is below the largest adapter's rank"):
        fit_to_workload(SearchSpace(knobs={"max_loras": {"values": [1, 4]}}), {"adapters": 3, "max_adapter_rank": 64}, p)


@pytest.mark.parametrize("config,says", [
    (b'{"r": ' + b"1" * 5001 + b"}", "more than 4,300 digits"),
    (b'{"r": 8, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deep"),
])
def test_an_adapter_config_past_the_json_parser_limits_is_one_line(tmp_path: Path, config: bytes, says: str) -> None:
    d = make_adapter(tmp_path, "alice")
    (d / "adapter_config.json").write_bytes(config)
    with pytest.raises(UserError) as e:
        read_lora_dir(tmp_path)
    assert says in str(e.value) and "adapter_config.json" in str(e.value)


def test_a_catalog_with_a_control_byte_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "cat.yaml"
    p.write_bytes(b"rank: 16\nadapters: [a, b]\x1b\n")
    with pytest.raises(UserError) as e:
        read_lora_dir(p)
    assert "cat.yaml:2" in str(e.value) and "control character (#x001b)" in str(e.value)


def _lora_header(rank: int) -> dict:
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    return {"__metadata__": {"format": "pt"},
            name.format("A"): {"dtype": "F32", "shape": [rank, 64], "data_offsets": [0, 4 * rank * 64]},
            name.format("B"): {"dtype": "F32", "shape": [64, rank], "data_offsets": [4 * rank * 64, 8 * rank * 64]}}


def test_an_adapter_whose_config_rank_is_not_its_weights_rank_is_one_line(tmp_path: Path) -> None:
    make_adapter(tmp_path, "alice", rank=8, weights=blob(8192, _lora_header(8)))
    assert read_lora_dir(tmp_path).by_name["alice"].rank == 8  # config and weights agree
    make_adapter(tmp_path, "bob", rank=16, weights=blob(8192, _lora_header(8)))
    with pytest.raises(UserError) as e:
        read_lora_dir(tmp_path)
    msg = str(e.value)
    assert "bob/adapter_config.json" in msg and "r: is 16 but the weights" in msg and "rank 8" in msg, msg
    assert len(msg.splitlines()) == 1


@pytest.mark.parametrize("weights,says", [
    (b"\xff" * 64, "header length"),                                    # a length past any real header
    (b"\x05\0\0\0\0\0\0\0{abc}", "not a safetensors file"),             # its header is not JSON
    (b"\x04\0\0\0\0\0\0\0[1] ", "not a JSON object"),
    (b"", "shorter than the 8"),                                         # empty
])
def test_adapter_weights_that_are_not_safetensors_are_named(tmp_path: Path, weights: bytes, says: str) -> None:
    make_adapter(tmp_path, "alice", weights=weights)
    with pytest.raises(UserError) as e:
        read_lora_dir(tmp_path)
    assert "alice/adapter_model.safetensors" in str(e.value) and says in str(e.value), str(e.value)
