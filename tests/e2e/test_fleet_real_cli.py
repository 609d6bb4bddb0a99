"""`tune plan --verify RUN --real-router` as a user runs it: the verified fleet once more in real time, the
real vLLM Router in front of two HTTP-simulator replicas, real beside virtual; bad input is one line,
exit 2, nothing created, and no router or replica outlives the command (also when the router dies).

The happy path needs the `vllm-router` binary (the `fleet` extra; CI: .ci/setup-router.sh) and skips
without it; the bad-input cases use small stand-in router scripts, so they run everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import tune, tune_env, wait_for
from tests.e2e.test_workload_cli import assert_user_error
from tuner.errors import UserError
from tuner.fleet.real import ROUTER_ENV, router_binary

pytestmark = pytest.mark.e2e
RUN = ROOT / "reports" / "chat-rtx4090-qwen2.5-7b"
#: short outputs so the last request ends soon after the 3 s window (the study's chat outputs run ~10 s)
SHORT = "".join(f'{{"prompt_tokens": {200 + 37 * i}, "output_tokens": 12, "tenant": "t{i % 3}"}}\n' for i in range(30))
#: the vLLM Router's `--help` line that lists its policies (what `check_router` reads)
HELP = "usage: vllm-router [--policy {%s}]"

try:
    router_binary()
    MISSING = None
except UserError as e:
    MISSING = str(e)


def marked(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (every process the command started inherits it)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if marker.encode() in (d / "environ").read_bytes() and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def none_left(marker: str) -> bool:
    return wait_for(lambda: not marked(marker), 15, what="the command's processes to exit") is not None


def fake_router(tmp: Path, script: str) -> Path:
    p = tmp / "bin" / "vllm-router"
    p.parent.mkdir(exist_ok=True)
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)
    return p


def as_a_vllm_study(tmp_path: Path) -> Path:
    """The example study as if its trials had run on real vLLM (its stored info says so)."""
    import optuna

    from tuner.storage.reader import storage_url

    run = tmp_path / "vllm-study"
    run.mkdir()
    for f in ("study.db", "study_name.txt"):
        shutil.copy(RUN / f, run / f)
    study = optuna.load_study(study_name=(run / "study_name.txt").read_text().strip(), storage=storage_url(run))
    info = dict(study.user_attrs["info"])
    info["simulated"], info["settings"] = False, {**info["settings"], "engine": {**info["settings"]["engine"],
                                                                                 "name": "vllm"}}
    study.set_user_attr("info", info)
    return run


def real_tune(tmp_path: Path, *args, router: Path | None = None, run: Path = RUN):
    marker = f"S39_MARK_{uuid.uuid4().hex}"
    env = tune_env(**{marker: "1"}, **({ROUTER_ENV: str(router)} if router else {}))
    (tmp_path / "short.jsonl").write_text(SHORT)
    p = tune("plan", "--verify", run, "--peak-rate", "4", "--policy", "round_robin", "--surge-s", "10",
             "--cold-start-s", "5", "--workload", tmp_path / "short.jsonl", "--fleet-out", tmp_path / "fleet",
             "--real-router", *args, cwd=ROOT, env=env, timeout=300)
    return p, marker


@pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")
def test_the_verified_fleet_through_the_real_router(tmp_path):
    """On a study of real vLLM: the replicas are simulators, and the output says so before any number."""
    p, marker = real_tune(tmp_path, "--real-replicas", "2", "--real-duration", "3", "--stop-replica-at", "2",
                          run=as_a_vllm_study(tmp_path))
    assert p.returncode == 0, p.stderr
    assert ("real router: the study ran on vllm; the real-router run's replicas are the HTTP simulator of its "
            "GPU and model profiles, not vLLM") in p.stdout
    line = next(x for x in p.stdout.splitlines() if x.startswith("real router round_robin: 2 replicas"))
    assert "HTTP simulator" in line and "attainment real" in line and "p99 TTFT real" in line, line
    assert none_left(marker)
    rows = json.loads((tmp_path / "fleet" / "fleet-real.json").read_text())
    row = rows[0]
    assert row["policy"] == "round_robin" and row["replicas"] == 2 and row["stop_replica_at"] == 2.0
    assert row["real"]["served_per_replica"][0] is None       # stopped mid-run: no second scrape
    assert row["real"]["served_per_replica"][1] > 0           # the other one served through the router
    assert 0.0 <= row["real"]["attainment"] <= 1.0 and row["real"]["p99_ttft_ms"] > 0
    assert sum(row["virtual"]["served_per_replica"]) == row["requests"]
    assert (tmp_path / "fleet" / "fleet.json").exists()


def test_a_router_that_dies_at_start_leaves_nothing(tmp_path):
    """Its `--help` answers (so the pre-check passes), then it exits at once: the replicas already
    started are stopped, one line, exit 2, no output folder."""
    router = fake_router(tmp_path, f'[ "$1" = --help ] && {{ echo "{HELP % "round_robin,cache_aware"}"; exit 0; }}\n'
                                   'echo "error: the router could not bind" >&2; exit 1\n')
    p, marker = real_tune(tmp_path, "--real-replicas", "2", "--real-duration", "2", router=router)
    assert_user_error(p, "--real-router: the vLLM Router did not start")
    assert "not vLLM" not in p.stdout  # a simulated study: nothing to disclaim
    assert none_left(marker)
    assert not (tmp_path / "fleet").exists()


@pytest.mark.parametrize("script,args,expected", [
    ("exit 1\n", [], "--real-router: the vLLM Router at"),
    (f'echo "{HELP % "round_robin,random"}"\n', ["--policy", "cache_aware"],
     "--policy: the vLLM Router at"),
    (None, ["--real-replicas", "0"], "--real-replicas: must be in [1, 64]"),
    (None, ["--peak-rate", "0"], "--peak-rate: must be a number > 0"),
    (None, ["--real-duration", "0"], "--real-duration: must be in (0, 600]"),
    (None, ["--time-scale", "nan"], "--time-scale: must be in (0, 100]"),
    (None, ["--stop-replica-at", "30"], "--stop-replica-at: must be inside the run"),
])
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, script, args, expected):
    router = fake_router(tmp_path, script if script else f'echo "{HELP % "round_robin,cache_aware"}"\n')
    p, marker = real_tune(tmp_path, *args, router=router)
    assert_user_error(p, expected)
    assert not (tmp_path / "fleet").exists() and none_left(marker)


def test_the_router_not_installed_says_how(tmp_path, monkeypatch, capsys):
    """No binary anywhere it is looked for (TUNER_VLLM_ROUTER, PATH, beside the interpreter)."""
    from tuner.cli import main

    monkeypatch.delenv(ROUTER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(sys, "argv", ["tune", "plan", "--verify", str(RUN), "--real-router",
                                      "--fleet-out", str(tmp_path / "fleet")])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: --real-router: the vLLM Router (vllm-router) is not installed: pip install "
                             "'slo-tuner[fleet]' (CI: .ci/setup-router.sh)"), err[0]
    assert not (tmp_path / "fleet").exists()


def test_real_router_needs_verify(tmp_path):
    assert_user_error(tune("plan", RUN, "--real-router", cwd=ROOT, env=tune_env()),
                      "--real-router: acts only with --verify")
    assert os.listdir(tmp_path) == []
