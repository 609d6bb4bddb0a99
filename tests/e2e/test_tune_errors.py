"""Bad input to `tune` ends in one clear line on stderr and exit code 2, never a traceback, and leaves no
study behind (so the corrected command runs without `--resume`)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.e2e.conftest import GPU, MODEL, SLO, WORKLOAD, sqlite_url, tune

pytestmark = pytest.mark.e2e

BAD_SPACE = """\
name: typo
knobs:
  max_num_seqs: {values: [8, 64]}
  max_num_sequences: {values: [8, 64]}
"""
NEG_SLO = """\
name: negative
ttft: {max_ms: 300}
tpot: {max_ms: -50}
"""


def assert_one_line_exit_2(p, *expected: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: "), lines[0]
    for e in expected:
        assert e in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", ["unknown_knob", "negative_slo", "missing_workload", "sim_without_gpu",
                                  "unknown_strategy", "unknown_engine", "unknown_gpu"])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    out = tmp_path / "run"
    args = {"--workload": str(WORKLOAD), "--slo": str(SLO), "--engine": "sim", "--gpu": GPU, "--model": MODEL,
            "--out": str(out), "--max-trials": "2"}
    if case == "unknown_knob":
        (tmp_path / "space.yaml").write_text(BAD_SPACE)
        args["--search-space"] = str(tmp_path / "space.yaml")
        expected = [f"{tmp_path / 'space.yaml'}:4:", "unknown knob 'max_num_sequences'"]
    elif case == "negative_slo":
        (tmp_path / "neg.slo.yaml").write_text(NEG_SLO)
        args["--slo"] = str(tmp_path / "neg.slo.yaml")
        expected = [f"{tmp_path / 'neg.slo.yaml'}:3:", "tpot.max_ms", "must be > 0"]
    elif case == "missing_workload":
        args["--workload"] = str(tmp_path / "nope.jsonl")
        expected = [str(tmp_path / "nope.jsonl"), "no such file"]
    elif case == "sim_without_gpu":
        del args["--gpu"]
        expected = ["--engine sim needs --gpu"]
    elif case == "unknown_strategy":
        args["--strategy"] = "anneal"
        expected = ["--strategy", "unknown strategy 'anneal'", "guided"]
    elif case == "unknown_engine":
        args["--engine"] = "tgi"
        expected = ["unknown engine 'tgi'", "sim-http"]
    else:
        args["--gpu"] = "gtx480"
        expected = ["gtx480"]
    p = tune(*[x for kv in args.items() for x in kv], timeout=60)
    assert_one_line_exit_2(p, *expected)
    assert not (out / "study.db").exists(), "a rejected command must not leave a study behind"


def test_corrected_command_runs_after_a_rejected_one(tmp_path: Path) -> None:
    """The same --out works once the mistake is fixed: no `--resume` needed, no 'study already exists'."""
    out = tmp_path / "run"
    base = ["--workload", WORKLOAD, "--slo", SLO, "--engine", "sim", "--model", MODEL, "--out", out,
            "--search-space", str(Path(__file__).parents[1] / "fixtures" / "tune" / "space2.yaml"),
            "--max-trials", "1", "--requests-per-run", "200"]
    assert_one_line_exit_2(tune(*base), "--engine sim needs --gpu")
    p = tune(*base, "--gpu", GPU)
    assert p.returncode == 0, p.stderr
    assert "stopped:" in p.stdout


@pytest.mark.parametrize("bad,expected", [(["--max-trials", "many"], "--max-trials"),
                                          (["--no-such-option"], "No such option: --no-such-option")])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, bad: list[str], expected: str) -> None:
    p = tune("--workload", WORKLOAD, "--slo", SLO, "--gpu", GPU, "--model", MODEL, "--out", tmp_path / "o",
             *bad, timeout=60)
    assert_one_line_exit_2(p, expected)


def test_resume_with_another_strategy_or_workload_is_refused_and_the_study_left_as_it_was(tmp_path: Path) -> None:
    """`--resume` continues the study that was started: an option it was started with, changed, would mix
    launches of two workloads or follow another strategy's plan. One line naming the option, exit 2,
    the stored study untouched; the resume command as started still runs."""
    out = tmp_path / "run"
    workload = tmp_path / "chat.jsonl"
    workload.write_bytes(Path(WORKLOAD).read_bytes())
    base = ["--workload", workload, "--slo", SLO, "--engine", "sim", "--gpu", GPU, "--model", MODEL,
            "--out", out, "--search-space", str(Path(__file__).parents[1] / "fixtures" / "tune" / "space2.yaml"),
            "--requests-per-run", "200", "--strategy", "guided", "--no-confirm"]
    p = tune(*base, "--max-trials", "1")
    assert p.returncode == 0, p.stderr

    def trials():
        st = optuna.load_study(study_name="slo-tuner", storage=sqlite_url(out))
        return [(t.number, t.state, t.datetime_complete) for t in st.get_trials(deepcopy=False)]

    before = trials()
    line = assert_one_line_exit_2(tune(*base, "--max-trials", "2", "--resume", "--strategy", "grid"), "--strategy")
    assert "guided" in line, line
    workload.write_bytes(workload.read_bytes() + workload.read_bytes().splitlines(keepends=True)[0])
    assert_one_line_exit_2(tune(*base, "--max-trials", "2", "--resume"), "--workload")
    assert trials() == before
    workload.write_bytes(Path(WORKLOAD).read_bytes())
    p = tune(*base, "--max-trials", "2", "--resume")
    assert p.returncode == 0, p.stderr
    assert len(trials()) > len(before)
