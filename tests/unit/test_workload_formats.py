"""Every supported format loads from a real or realistic file, and every bad input says where it is bad."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tuner.errors import UserError
from tuner.tokens import count_tokens
from tuner.workload.loader import detect_format, load_workload, save_workload

WL = FIXTURES / "workloads"
ROOT = FIXTURES.parent.parent


def test_azure_trace_loads_with_arrivals_from_the_first_row(shared_dir: Path) -> None:
    w = load_workload(shared_dir / "traces" / "azure_llm_2023_conv.csv")
    assert w.source_format == "azure"
    assert len(w.requests) > 19_000
    first = w.requests[0]
    # 2023-11-16 18:15:46.6805900,374,44 then 18:15:50.9951690,396,109
    assert (first.prompt_tokens, first.output_tokens, first.arrival_s) == (374, 44, 0.0)
    assert w.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert w.has_arrivals
    assert 3400 < w.requests[-1].arrival_s < 3600  # a one-hour sample
    mean_prompt = sum(r.prompt_tokens for r in w.requests) / len(w.requests)
    mean_out = sum(r.output_tokens for r in w.requests) / len(w.requests)
    assert mean_prompt == pytest.approx(1155, rel=0.01)  # the trace README's figures
    assert mean_out == pytest.approx(211, rel=0.01)


def test_shipped_azure_excerpt_is_the_head_of_the_trace(shared_dir: Path) -> None:
    full = load_workload(shared_dir / "traces" / "azure_llm_2023_conv.csv")
    excerpt = load_workload(ROOT / "workloads" / "azure_conv_excerpt.csv")
    assert len(excerpt.requests) == 2000
    assert excerpt.requests == full.requests[:2000]


def test_mooncake_trace_maps_ids_lengths_and_millisecond_timestamps() -> None:
    w = load_workload(WL / "mooncake_trace.jsonl")
    assert w.source_format == "mooncake"
    raw = [json.loads(line) for line in (WL / "mooncake_trace.jsonl").read_text().splitlines()]
    assert len(w.requests) == len(raw)
    for r, d in zip(w.requests, raw):
        assert r.prompt_tokens == d["input_length"]
        assert r.output_tokens == d["output_length"]
        assert r.prefix_hash_ids == d["hash_ids"]
        assert r.hash_block_size == 512
        assert r.arrival_s == pytest.approx((d["timestamp"] - raw[0]["timestamp"]) / 1000)


def test_sharegpt_takes_first_human_turn_and_answer_length() -> None:
    w = load_workload(WL / "sharegpt_small.json")
    assert w.source_format == "sharegpt"
    assert len(w.requests) == 4
    assert w.requests[0].prompt.startswith("Summarize this: Almost every cell")
    answer = ("Mitochondria, present in almost every cell, turn the energy from food into a usable form for the "
              "cell, earning them the nickname \"powerhouse of the cell\".")
    assert w.requests[0].output_tokens == count_tokens(answer)
    # the system turn is skipped: the prompt is the first *human* turn, output its answer (not the last one)
    assert w.requests[1].prompt == "How do I reverse a list in Python?"
    assert w.requests[1].output_tokens > 20
    assert w.requests[3].output_tokens == 1  # an empty answer still asks for one token
    assert not w.has_arrivals


def test_sharegpt_as_jsonl_is_detected_too(tmp_path: Path) -> None:
    conv = json.loads((WL / "sharegpt_small.json").read_text())
    p = tmp_path / "sg.jsonl"
    p.write_text("\n".join(json.dumps(c) for c in conv))
    assert [r.prompt for r in load_workload(p).requests] == [r.prompt for r in
                                                             load_workload(WL / "sharegpt_small.json").requests]


def test_vllm_custom_ignores_extra_keys_and_blank_lines() -> None:
    w = load_workload(WL / "vllm_custom.jsonl")
    assert w.source_format == "vllm-custom"
    assert [r.output_tokens for r in w.requests] == [180, 256, 40, 320, 24, 812]
    assert w.requests[4].prompt == "Give me a haiku about autumn rain."


def test_tuner_format_roundtrips(tmp_path: Path) -> None:
    w = load_workload(WL / "tuner_format.jsonl")
    assert w.source_format == "tuner"
    assert w.requests[1].tenant == "acme" and w.requests[1].hash_block_size == 16
    assert w.requests[3].messages[1].content == "Name three primes."
    out = save_workload(w, tmp_path / "copy.jsonl")
    assert load_workload(out).requests == w.requests


def test_plain_prompt_output_lines_are_read_the_same_either_way(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"prompt": "hi there", "output_tokens": 3}\n')
    a = load_workload(p)
    b = load_workload(p, format="tuner")
    assert a.source_format == "vllm-custom"
    assert a.requests == b.requests


def test_our_fields_in_a_file_read_as_vllm_custom_are_not_dropped(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"prompt": "hi there", "output_tokens": 3}\n{"prompt": "yo", "output_tokens": 3, "tenant": "a"}\n')
    # detection reads past an ambiguous first line, so our own files with a text-only first request load
    assert load_workload(p).source_format == "tuner"
    assert load_workload(p).requests[1].tenant == "a"
    with pytest.raises(UserError, match="x.jsonl:2: tenant: not a vllm-custom field"):
        load_workload(p, format="vllm-custom")


def test_format_override_and_gzip(tmp_path: Path) -> None:
    p = tmp_path / "trace.data.gz"  # neither extension nor name says what it is
    p.write_bytes(gzip.compress((WL / "mooncake_trace.jsonl").read_bytes()))
    assert load_workload(p).source_format == "mooncake"
    assert load_workload(p, format="timed-trace").source_format == "mooncake"
    with pytest.raises(UserError) as e:
        load_workload(p, format="azure")  # forced to CSV: the header is wrong
    assert "missing column" in e.value.format()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = '{"prompt_tokens": 10, "output_tokens": 5}\n'


@pytest.mark.parametrize("name,text,expected", [
    ("chat.jsonl", GOOD * 16 + '{"prompt_tokens": 10, "output_tokens": 0}\n', "chat.jsonl:17: output_tokens: must be >= 1"),
    ("bad.jsonl", GOOD + '{"prompt_tokens": 10, "output_tokens": 5\n', "bad.jsonl:2: invalid JSON: Expecting ',' delimiter"),
    ("neg.jsonl", GOOD + GOOD + '{"prompt_tokens": -3, "output_tokens": 5}\n', "neg.jsonl:3: prompt_tokens: must be >= 1"),
    ("typo.jsonl", '{"prompt_tokens": 10, "output_tokens": 5, "tenat": "a"}\n', "typo.jsonl:1: tenat: unknown field"),
    ("mc.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 1}\n{"timestamp": 5, "input_length": 10}\n',
     "mc.jsonl:2: output_length: missing"),
    ("mc2.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}\n',
     "mc2.jsonl:1: hash_ids: 3 blocks of 512 tokens are longer than input_length (600)"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
               "2023-11-16 18:15:47.0,-5,44\n", "az.csv:3: ContextTokens: must be >= 1"),
    ("az2.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,374,44\n", "az2.csv:2: TIMESTAMP: not a date-time"),
    ("az3.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374\n", "az3.csv:2: GeneratedTokens: missing"),
    ("hdr.csv", "time,prompt,output\n1,2,3\n", "hdr.csv:1: cannot tell the format"),
    ("sg.json", '[\n{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n'
                '{"conversations": [{"from": "gpt", "value": "yo"}]}\n]', "sg.json:3: conversations: no human turn"),
    ("sg2.json", '[\n{"conversations": [{"from": "human", "value": "hi"}]},\n',
     "sg2.json:2: conversations: no gpt answer"),
    ("sg3.json", '[\n{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}\n',
     "sg3.json:3: invalid JSON: unexpected end of file"),
    ("odd.jsonl", '{"question": "hi", "answer_len": 3}\n', "odd.jsonl:1: cannot tell the format from its keys"),
    ("empty.jsonl", "\n\n", "empty.jsonl: empty file"),
    ("arr.jsonl", '{"prompt_tokens": 1, "output_tokens": 1, "arrival_s": 0}\n{"prompt_tokens": 1, "output_tokens": 1}\n',
     "arr.jsonl:2: arrival_s: missing"),
])
def test_bad_input_is_one_line_with_file_line_field(tmp_path: Path, name: str, text: str, expected: str) -> None:
    p = _write(tmp_path, name, text)
    with pytest.raises(UserError) as e:
        load_workload(p)
    msg = e.value.format()
    assert msg.startswith(str(tmp_path / expected)), msg
    assert "\n" not in msg
    assert e.value.exit_code == 2


def test_missing_file_directory_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nope.jsonl: no such file"):
        load_workload(tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="is a directory"):
        load_workload(tmp_path)
    p = _write(tmp_path, "x.jsonl", GOOD)
    with pytest.raises(UserError, match=r"x.jsonl: format: unknown format 'parquet' \(known: tuner, "):
        load_workload(p, format="parquet")
    with pytest.raises(UserError, match="not UTF-8"):
        (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00{")
        load_workload(tmp_path / "bin.jsonl")


def test_skip_invalid_skips_and_reports_every_bad_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "mixed.jsonl", GOOD + "{oops\n" + GOOD + '{"prompt_tokens": 3, "output_tokens": -1}\n' + GOOD)
    with pytest.raises(UserError, match="mixed.jsonl:2: invalid JSON"):
        load_workload(p)
    w = load_workload(p, skip_invalid=True)
    assert len(w.requests) == 3
    assert len(w.skipped) == 2
    assert w.skipped[0].endswith("mixed.jsonl:2: invalid JSON: Expecting property name enclosed in double quotes "
                                 "(column 2)")
    assert w.skipped[1].endswith("mixed.jsonl:4: output_tokens: must be >= 1")


def test_skip_invalid_with_nothing_left_is_still_an_error(tmp_path: Path) -> None:
    p = _write(tmp_path, "allbad.jsonl", '{"prompt_tokens": 3, "output_tokens": 0}\n')
    with pytest.raises(UserError, match="no requests .1 invalid skipped; first: .*allbad.jsonl:1: output_tokens"):
        load_workload(p, skip_invalid=True)


def test_detection_names(tmp_path: Path) -> None:
    assert detect_format(WL / "mooncake_trace.jsonl") == "mooncake"
    assert detect_format(WL / "sharegpt_small.json") == "sharegpt"
    assert detect_format(WL / "vllm_custom.jsonl") == "vllm-custom"
    assert detect_format(WL / "tuner_format.jsonl") == "tuner"
    # a CSV without the .csv extension is still recognised from its header
    p = _write(tmp_path, "trace", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n")
    assert detect_format(p) == "azure"
