"""tools/study_dump.py: the check that a refactoring changed no answer (issue 62). The same study run twice
dumps the same, byte for byte; a changed capacity in one shows in the diff and its exit code; the stored
study is only read."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import GPU, MODEL, SLO, TUNE_FIX, WORKLOAD, tune

pytestmark = pytest.mark.e2e


def run(out: Path) -> None:
    p = tune("--workload", WORKLOAD, "--slo", SLO, "--engine", "sim", "--gpu", GPU, "--model", MODEL,
             "--search-space", TUNE_FIX / "space2.yaml", "--max-trials", "3", "--no-confirm", "--windows", "0",
             "--requests-per-run", "300", "--out", out, timeout=300)
    assert p.returncode == 0, p.stderr


def dump(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "study_dump.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def test_the_same_study_twice_dumps_the_same_and_a_change_shows(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run(a)
    run(b)
    sha = hashlib.sha256((a / "study.db").read_bytes()).hexdigest()
    same = dump("--diff", a, b)
    assert same.returncode == 0 and same.stdout == "", same.stdout[:2000]
    assert json.loads(dump(a).stdout)["trials"], "the dump lists the study's trials"
    assert hashlib.sha256((a / "study.db").read_bytes()).hexdigest() == sha  # only read

    changed = tmp_path / "changed"
    shutil.copytree(b, changed)
    con = sqlite3.connect(changed / "study.db")
    (trial_id, value), *_ = con.execute("SELECT trial_id, value_json FROM trial_user_attributes "
                                        "WHERE key = 'record' ORDER BY trial_id DESC").fetchall()
    rec = json.loads(value)
    rec["capacity_rps"] = (rec["capacity_rps"] or 1.0) * 1.01
    con.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = 'record'",
                (json.dumps(rec), trial_id))
    con.commit()
    con.close()
    diff = dump("--diff", a, changed)
    assert diff.returncode == 1 and "capacity_rps" in diff.stdout, diff.stdout[:2000]
