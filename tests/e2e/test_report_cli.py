"""`tune` end to end on the simulator, then `tune report` rebuilding the same report from its storage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e.conftest import tune as tune_run
from tests.e2e.test_workload_cli import assert_user_error, tune

pytestmark = pytest.mark.e2e

SCENARIO = ["--workload", "workloads/chat.jsonl", "--slo", "workloads/chat.slo.yaml", "--engine", "sim",
            "--gpu", "rtx4090", "--model", "Qwen/Qwen2.5-7B-Instruct"]


def tuned_run(tmp_path_factory: pytest.TempPathFactory, max_trials: int) -> Path:
    """A real `tune` run of the seed scenario (cached for the session by its trial budget)."""
    out = tmp_path_factory.getbasetemp() / f"tune-run-{max_trials}"
    if not (out / "report.json").exists():
        shutil.rmtree(out, ignore_errors=True)
        # the README's main job: the twin ranks 160 configurations (80 s on an idle 2-core host)
        p = tune_run(*SCENARIO, "--max-trials", str(max_trials), "--out", out, cwd=ROOT, timeout=900)
        assert p.returncode == 0, (p.stdout, p.stderr)
        out.with_suffix(".stdout").write_text(p.stdout)  # beside the run: the run's files stay the tool's
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return tuned_run(tmp_path_factory, 4)


def test_tune_leaves_report_plan_and_gate(run):
    for name in ("report.md", "report.html", "report.json", "tuned-config.yaml", "gate.yaml",
                 "plots/knee.svg"):
        assert (run / name).stat().st_size > 0, name
    rep = json.loads((run / "report.json").read_text())
    assert rep["title"].startswith("SIMULATED")
    assert rep["baseline"]["capacity_rps"] > 0 and rep["tuned"]["capacity_rps"] >= rep["baseline"]["capacity_rps"]
    assert rep["plan"]["instances"] >= 1
    # the terminal's summary names the trials the report names
    said = run.with_suffix(".stdout").read_text()
    from tuner.recommend import Recommendation

    r = Recommendation.model_validate(rep["recommendation"])
    assert (r.baseline_line() or f"baseline (vLLM defaults, trial {rep['baseline']['trial']}): ") in said, said
    assert "None" not in said and " ?" not in said
    md = (run / "report.md").read_text()
    assert "## Headline" in md and "vllm serve Qwen/Qwen2.5-7B-Instruct" in md


def test_the_summary_headline_config_and_gate_agree_on_the_paired_decision(run):
    """The README's main job (chat on the simulated RTX 4090): the search's best gains a few percent with
    FP8 KV among its knobs, near the 5% floor. The decision is the paired check's (`tuner.search.earn`,
    `tuner.recommend`): a change only where the lower end of its paired gain's 95% interval clears the
    floor. The CLI, report.md's headline, tuned-config.yaml and gate.yaml all carry the same one, whichever
    side of the floor it lands: the defaults with the search's best shown beside them, or the knobs that
    earned their place."""
    import yaml

    from tuner.recommend import Recommendation

    rep = json.loads((run / "report.json").read_text())
    r = Recommendation.model_validate(rep["recommendation"])
    said = run.with_suffix(".stdout").read_text()
    md = (run / "report.md").read_text()
    cfg = yaml.safe_load((run / "tuned-config.yaml").read_text())
    gate = yaml.safe_load((run / "gate.yaml").read_text())
    line = r.line()
    assert r.paired and r.baseline_line() in said
    assert line in said and line[0].upper() + line[1:] in md.split("## Headline")[0], (said, md[:2000])
    assert rep["tuned"]["trial"] == r.trial == gate["source_trial"]
    assert gate["knobs"] == r.knobs == rep["tuned"]["knobs"]
    assert gate["capacity_rps"] == r.capacity_rps
    assert {k.replace("-", "_"): v for k, v in (cfg or {}).items()} == r.knobs
    assert r.best_trial is not None and r.best_gain_pct is not None
    if r.kind == "defaults":  # the interval of the best's paired gain does not clear the floor
        assert r.knobs == {} and r.trial == rep["baseline"]["trial"] == r.defaults_trial
        assert not (r.best_significant and r.best_gain_pct > 100 * r.floor and r.best_trial == r.trial)
        assert line.startswith("keep vLLM's defaults") and "keep vllm's defaults" in md.lower()
        if r.best_trial != r.trial:
            assert r.best_line().startswith("the search's best") and r.best_line() in said
        assert "kv_cache_dtype" not in (run / "tuned-config.yaml").read_text()
    else:  # its interval clears the floor: the knobs that earned their place, each with its measured share
        assert r.knobs and r.trial != rep["baseline"]["trial"] and r.gain_low_pct >= 100 * r.floor
        assert line.startswith(f"recommended (trial {r.trial})")
        assert all(s.low_pct > 0 for s in r.shares if s.kept)


def test_tune_report_rebuilds_the_same_report_from_storage(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = json.loads((copy / "report.json").read_text())
    for name in ("report.json", "report.md", "report.html", "tuned-config.yaml"):
        (copy / name).unlink()
    shutil.rmtree(copy / "plots")
    p = tune_run("report", copy, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    from tuner.recommend import Recommendation

    line = Recommendation.model_validate(json.loads((run / "report.json").read_text())["recommendation"]).line()
    assert "baseline: " in p.stdout and line in p.stdout
    after = json.loads((copy / "report.json").read_text())
    assert before.pop("generated_unix") != 0 and after.pop("generated_unix") != 0
    assert after == before
    assert (copy / "tuned-config.yaml").read_text() == (run / "tuned-config.yaml").read_text()
    assert (copy / "report.md").read_text() == (run / "report.md").read_text()
    # gate.yaml is rewritten with the report, holding the same configuration
    gates = [yaml.safe_load((d / "gate.yaml").read_text()) for d in (copy, run)]
    assert [(g.pop("created_unix"), g.pop("source_run")) for g in gates] and gates[0] == gates[1]


def test_report_of_something_that_is_not_a_run(tmp_path):
    assert_user_error(tune("report", tmp_path), f"{tmp_path}: no study.db or storage.txt")
