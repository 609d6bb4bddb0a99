"""The commands that read a user's files never write them (issue 60): each one, run to success on a copy of
the shipped example study and its workload and SLO, leaves every input byte for byte as it was (`tune bench`,
which needs a server, is checked in tests/integration/test_bench_cli.py). A refusal leaving its inputs alone
is tests/e2e/test_bad_inputs.py's; this is the other half, the commands working.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import tune

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "reports" / "chat-rtx4090-qwen2.5-7b"


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture()
def inputs(tmp_path: Path) -> Path:
    """The example study and the files its gate names, laid out as in the repository (its paths are
    relative to the directory the gate runs from)."""
    shutil.copytree(EXAMPLE, tmp_path / "run")
    (tmp_path / "workloads").mkdir()
    for name in ("chat.jsonl", "chat.slo.yaml"):
        shutil.copy(ROOT / "workloads" / name, tmp_path / "workloads" / name)
    return tmp_path


# (argv, the outputs it may write: paths under the working directory)
COMMANDS = [
    (["workload", "inspect", "workloads/chat.jsonl"], []),
    (["workload", "check-slo", "workloads/chat.slo.yaml"], []),
    (["plan", "run"], []),
    (["plan", "run", "--verify", "--peak-rate", "5", "--policy", "round_robin", "--fleet-out", "fleet"], ["fleet"]),
    (["report", "run", "--out", "rebuilt"], ["rebuilt"]),
    (["gate", "run/gate.yaml"], []),
]


@pytest.mark.parametrize("argv,writes", COMMANDS, ids=[" ".join(c[0][:3]) for c in COMMANDS])
def test_a_read_only_command_leaves_its_inputs_as_they_were(inputs: Path, argv: list[str], writes: list[str]) -> None:
    before = digests(inputs)
    p = tune(*argv, cwd=inputs, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    after = {k: v for k, v in digests(inputs).items() if not any(k.startswith(w) for w in writes)}
    changed = sorted(k for k in before if after.get(k) != before[k])
    added = sorted(set(after) - set(before))
    assert not changed and not added, f"{' '.join(argv)} changed {changed} and added {added}"
