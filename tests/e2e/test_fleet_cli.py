"""`tune plan --verify RUN` as a user runs it on the shipped example study: the verified N beside the plan's,
the scenarios, the report files and the export; bad input is one line, exit 2, nothing created."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import ROOT
from tests.e2e.test_workload_cli import assert_user_error, tune

pytestmark = pytest.mark.e2e
RUN = ROOT / "reports" / "chat-rtx4090-qwen2.5-7b"


def test_verify_a_study_and_export_it(tmp_path):
    out = tmp_path / "fleet"
    p = tune("plan", "--verify", RUN, "--peak-rate", "5", "--policy", "round_robin", "--surge-s", "20",
             "--cold-start-s", "20", "--price-per-gpu-hour", "2.5", "--export", "--fleet-out", out, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "round_robin: plan N at the peak = " in p.stdout and "verified N = " in p.stdout
    v = json.loads((out / "fleet.json").read_text())
    n = v["policies"][0]["verified_n"]
    assert n >= 1 and v["plan_n"] >= 1 and [s["name"] for s in v["scenarios"]] == ["surge", "cold start", "autoscale"]
    assert v["cost_per_hour"] == pytest.approx((n + 1) * 2.5) and v["cost_per_million_output_tokens"] > 0
    assert (out / "fleet-timeline.svg").read_text().lstrip().startswith("<?xml")
    page = (out / "fleet.html").read_text()
    # the HTML page carries what fleet.md does: the policy's N table and the per-replica table, styled
    assert 'src="data:image/svg+xml;base64,' in page and "<style>" in page
    assert "Routing policy round_robin" in page and page.count("<table>") == 2 and "Per replica at N = " in page
    assert "## Routing policy round_robin" in (out / "fleet.md").read_text()
    values = yaml.safe_load((out / "values.yaml").read_text())
    assert values["servingEngineSpec"]["modelSpec"][0]["replicaCount"] == n + 1
    assert values["routerSpec"]["routingLogic"] == "roundrobin"


@pytest.mark.parametrize("args,expected", [
    (["--policy", "least_busy"], "--policy: unknown routing policy 'least_busy'"),
    (["--replicas", "0"], "--replicas: must be >= 1, got 0"),
    (["--replicas", "100000000"], "--replicas: must be <= 512"),
    (["--peak-rate", "0"], "--peak-rate: must be a number > 0"),
    (["--price-per-gpu-hour", "nan"], "--price-per-gpu-hour: must be a finite number >= 0"),
    (["--price-per-gpu-hour", "-1"], "--price-per-gpu-hour: must be a finite number >= 0"),
    (["--cold-start-s", "-5"], "--cold-start-s: must be a number of seconds"),
])
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, args, expected):
    out = tmp_path / "fleet"
    assert_user_error(tune("plan", "--verify", RUN, *args, "--fleet-out", out, cwd=ROOT), expected)
    assert not out.exists()


def test_a_folder_without_a_study_is_refused(tmp_path):
    assert_user_error(tune("plan", "--verify", tmp_path, cwd=ROOT), f"{tmp_path}: no study.db")
    assert list(tmp_path.iterdir()) == []


def test_verify_from_another_directory_reads_the_studys_own_workload(tmp_path):
    """A study records its inputs as given (here relative to the directory it ran in): `tune plan --verify`
    run from elsewhere reads them there, on the shipped study (recorded before the study kept its
    directory: placed by its relative `--out`) and on a fresh one (`--out` absolute: by the recorded one)."""
    import shutil

    from tests.e2e.conftest import TUNE_FIX

    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    (proj / "inputs").mkdir(parents=True)
    elsewhere.mkdir()
    for name in ("tiny.jsonl", "tiny.slo.yaml"):
        shutil.copy(TUNE_FIX / name, proj / "inputs" / name)
    run = tmp_path / "run"
    t = tune("--workload", "inputs/tiny.jsonl", "--slo", "inputs/tiny.slo.yaml", "--engine", "sim", "--gpu",
             "rtx4090", "--model", "qwen2.5-7b", "--strategy", "guided", "--max-trials", "1", "--no-confirm",
             "--requests-per-run", "300", "--out", run, cwd=proj)
    assert t.returncode == 0, t.stderr[-2000:]
    for study in (RUN, run):
        out = tmp_path / f"fleet-{study.name}"
        p = tune("plan", "--verify", study, "--peak-rate", "5", "--policy", "round_robin", "--surge-s", "20",
                 "--cold-start-s", "20", "--fleet-out", out, cwd=elsewhere)
        assert p.returncode == 0, p.stderr
        assert "round_robin: plan N" in p.stdout and (out / "fleet.json").is_file()
    assert list(elsewhere.iterdir()) == []
