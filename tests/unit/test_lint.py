"""The linter and the type checker on the package (`pyproject.toml` configures both; the test extras
install both, so the README's test command runs them). Each skips, saying why, only where the tool is not
installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[test]' installs it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing_in_the_package() -> None:
    r = _run("ruff", "check", "--no-cache", "tuner")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.timeout(900)
def test_mypy_finds_nothing_in_the_package() -> None:
    r = _run("mypy", "tuner")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr
