"""A study with no launched, or no passing, configuration is no result and says so (issue 12, item 5):
a documented non-zero exit (3: nothing launched, 4: nothing met the SLO), one line on stderr saying why,
a report that presents nothing as best, and no gate.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.e2e.conftest import SLO, TUNE_FIX, WORKLOAD, load_trials, record, sqlite_url, study_args, tune
from tuner.storage.status import EXIT_NO_LAUNCH, EXIT_NO_PASS

pytestmark = pytest.mark.e2e


def study(out: Path, model: str, slo: Path, *extra: str) -> list[str]:
    return ["--workload", str(WORKLOAD), "--slo", str(slo), "--engine", "sim", "--gpu", "rtx4090",
            "--model", model, "--search-space", str(TUNE_FIX / "space2.yaml"), "--max-trials", "3",
            "--requests-per-run", "300", "--out", str(out), *extra]


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


def assert_no_result(out: Path, p, code: int, why: str) -> str:
    assert p.returncode == code, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    (line,) = error_lines(p.stderr)
    assert line.startswith(f"error: {why}"), line
    assert f"NO RESULT: {why}" in p.stdout and "tuned:" not in p.stdout, p.stdout
    # no gate, and no "tuned" config file that would read as "the defaults were best"
    assert not (out / "gate.yaml").exists() and not (out / "tuned-config.yaml").exists()
    assert "gate.yaml" not in p.stdout
    rep = json.loads((out / "report.json").read_text())
    assert rep["status"] == ("no_launch" if code == EXIT_NO_LAUNCH else "no_pass")
    assert rep["status_text"].startswith(why) and rep["gate_written"] is False
    assert rep["tuned"]["trial"] is None and rep["serve_command"] == ""
    md = (out / "report.md").read_text()
    assert "NO RESULT" in md.splitlines()[0], md.splitlines()[0]
    for wrong in ("defaults were best", "The tuned configuration", "tune gate", "on None", "Headline"):
        assert wrong not in md, wrong
    return md


def test_a_study_where_nothing_launches_exits_3_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # a 70B model in 16-bit weights does not fit a 24 GB GPU with any knob of the space
    p = tune(*study(out, "meta-llama/Llama-3.1-70B-Instruct", SLO))
    md = assert_no_result(out, p, EXIT_NO_LAUNCH, "no configuration launched")
    assert "oom" in error_lines(p.stderr)[0]
    assert "out of reach" not in md  # nothing was measured: the SLO is not what failed


def test_a_study_where_nothing_meets_the_slo_exits_4_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune(*study(out, "qwen2.5-7b", TUNE_FIX / "impossible.slo.yaml"))
    assert_no_result(out, p, EXIT_NO_PASS, "no configuration met the SLO at any offered rate")


def test_report_rebuilt_from_storage_still_says_no_result(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = tune(*study(out, "qwen2.5-7b", TUNE_FIX / "impossible.slo.yaml"))
    assert p.returncode == EXIT_NO_PASS
    for f in ("report.md", "report.json"):
        (out / f).unlink()
    r = tune("report", out)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "report.json").read_text())["status"] == "no_pass"
    assert not (out / "gate.yaml").exists()


def test_a_server_that_fails_every_request_ends_the_study_within_a_minute(tmp_path: Path) -> None:
    """Issue 12, item 4: a launch whose requests all fail is a failed trial with the server's words, not
    a capacity search halving the rate for hours; when vLLM's defaults fail them, no other launch is
    tried (no knob answers a server that serves nothing), and the study is no result (exit 4)."""
    out = tmp_path / "run"
    template = f"{sys.executable} -m tuner.testing.standin_server --port {{port}} --fail-requests 500 {{args}}"
    args = study_args(out, "vllm", "--model", "standin", "--vllm-command", template, max_trials=5)
    t0 = time.monotonic()
    p = tune(*args, timeout=120)
    took = time.monotonic() - t0
    assert took < 60, f"took {took:.0f} s"
    md = assert_no_result(out, p, EXIT_NO_PASS, "every request failed")
    line = error_lines(p.stderr)[0]
    assert "HTTP 500" in line or "http_5xx" in line, line
    assert "this request failed on purpose" in line, line  # the server's own words
    (trial,) = load_trials(sqlite_url(out))
    rec = record(trial)
    assert trial.state == TrialState.FAIL and rec["launched"] is True
    assert rec["launch_failure_kind"] == "requests_failed" and rec["capacity_rps"] is None
    assert len(rec["load_runs"]) == 1 and rec["load_runs"][0]["stopped_early"], rec["load_runs"]
    assert "every request failed" in md
