"""`tune workload ...` as a user runs it: a real process, its exit code, its stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT

pytestmark = pytest.mark.e2e

_TUNE = Path(sys.executable).parent / "tune"
TUNE = [str(_TUNE)] if _TUNE.exists() else [sys.executable, "-m", "tuner.cli"]


def tune(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([*TUNE, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)


def assert_user_error(p: subprocess.CompletedProcess[str], expected: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0] == f"error: {expected}" or lines[0].startswith(f"error: {expected}"), lines[0]


GOOD = '{"prompt_tokens": 10, "output_tokens": 5}\n'
MC = '{"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]}\n'


@pytest.mark.parametrize("name,text,args,expected", [
    ("bad.jsonl", GOOD + '{"prompt_tokens": 10 "output_tokens": 5}\n', [],
     "bad.jsonl:2: invalid JSON: Expecting ',' delimiter (column 22)"),
    ("missing.jsonl", MC * 3 + '{"timestamp": 3, "input_length": 10}\n', [],
     "missing.jsonl:4: output_length: missing"),
    ("chat.jsonl", GOOD * 16 + '{"prompt_tokens": 10, "output_tokens": -4}\n', [],
     "chat.jsonl:17: output_tokens: must be >= 1"),
    ("trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,-374,44\n", [],
     "trace.csv:2: ContextTokens: must be >= 1"),
    ("ok.jsonl", GOOD, ["--format", "parquet"],
     "ok.jsonl: format: unknown format 'parquet' (known: tuner, vllm-custom, sharegpt, azure, mooncake)"),
])
def test_inspect_bad_file_is_one_line_and_exit_2(tmp_path: Path, name: str, text: str, args: list[str],
                                                 expected: str) -> None:
    (tmp_path / name).write_text(text)
    assert_user_error(tune("workload", "inspect", name, *args, cwd=tmp_path), expected)


def test_inspect_missing_file(tmp_path: Path) -> None:
    assert_user_error(tune("workload", "inspect", "nope.jsonl", cwd=tmp_path), "nope.jsonl: no such file")


def test_skip_invalid_reports_skipped_lines(tmp_path: Path) -> None:
    (tmp_path / "mixed.jsonl").write_text(GOOD + "{oops\n" + GOOD)
    p = tune("workload", "inspect", "mixed.jsonl", "--skip-invalid", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "skipped: mixed.jsonl:2: invalid JSON" in p.stderr
    assert "2 requests, 1 invalid lines skipped" in p.stdout


def test_inspect_azure_excerpt_shows_rate_and_histogram() -> None:
    p = tune("workload", "inspect", ROOT / "workloads" / "azure_conv_excerpt.csv")
    assert p.returncode == 0, p.stderr
    assert "(azure): 2000 requests" in p.stdout
    assert "arrivals: 4.71 req/s" in p.stdout
    assert "shared prefix: unknown" in p.stdout
    assert "1024-2048" in p.stdout and "█" in p.stdout


@pytest.mark.parametrize("fixture,fmt,n", [
    ("mooncake_trace.jsonl", "mooncake", 24),
    ("sharegpt_small.json", "sharegpt", 4),
    ("vllm_custom.jsonl", "vllm-custom", 6),
])
def test_inspect_json_of_fixtures(fixture: str, fmt: str, n: int) -> None:
    p = tune("workload", "inspect", FIXTURES / "workloads" / fixture, "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert (s["source_format"], s["requests"]) == (fmt, n)
    if fmt == "mooncake":
        assert s["arrival_rate"] > 0 and s["block_reuse"] > 0.3


def test_synth_is_deterministic_and_inspectable(tmp_path: Path) -> None:
    for out in ("a.jsonl", "b.jsonl"):
        p = tune("workload", "synth", "--kind", "multitenant", "--requests", "300", "--seed", "4", "--out", out,
                 cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert "wrote 300 multitenant requests" in p.stdout
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    p = tune("workload", "inspect", "a.jsonl", "--json", cwd=tmp_path)
    s = json.loads(p.stdout)
    assert s["requests"] == 300 and s["tenants"] > 10 and s["requests_sharing_prefix"] > 0.9


def test_synth_bad_kind(tmp_path: Path) -> None:
    assert_user_error(tune("workload", "synth", "--kind", "poem", "--out", "x.jsonl", cwd=tmp_path),
                      "--kind: unknown kind 'poem' (known: chat, rag, multitenant, longtail, multitenant-lora)")


def test_check_slo_good_and_bad(tmp_path: Path) -> None:
    p = tune("workload", "check-slo", ROOT / "workloads" / "chat.slo.yaml")
    assert p.returncode == 0, p.stderr
    assert "p99 TTFT <= 300 ms, p99 TPOT <= 50 ms; target 0.99; peak 50 req/s, headroom 0.7" in p.stdout
    (tmp_path / "bad.slo.yaml").write_text("ttft_ms: 300\ntpot:\n  max_ms: -50\n")
    assert_user_error(tune("workload", "check-slo", "bad.slo.yaml", cwd=tmp_path),
                      "bad.slo.yaml:3: tpot.max_ms: must be > 0")
    (tmp_path / "typo.slo.yaml").write_text("ttft_ms: 300\nheadrom: 0.5\n")
    assert_user_error(tune("workload", "inspect", ROOT / "workloads" / "chat.jsonl", "--slo", "typo.slo.yaml",
                           cwd=tmp_path), "typo.slo.yaml:2: headrom: unknown field")


def test_tune_help_lists_the_workload_group() -> None:
    p = tune("--help")
    assert p.returncode == 0, p.stderr
    assert "workload" in p.stdout
