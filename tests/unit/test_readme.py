"""The README states what the tool does (issue 62): under 200 lines, no dated lab notes (figures and their
dates live on the results page), its first command the main job on the simulated engine and its second
the tests, and every page it links to exists."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_carries_no_dates() -> None:
    assert len(README.splitlines()) < 200
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dated figures belong on benchmarks/RESULTS.md"


def test_its_first_command_is_the_main_job_on_the_simulator_and_its_second_the_tests() -> None:
    blocks = re.findall(r"```\n(.*?)```", README, flags=re.S)
    runnable = [b for b in blocks if "pip install" in b or "pytest" in b]
    assert "tune --workload workloads/chat.jsonl" in runnable[0] and "--gpu rtx4090" in runnable[0]
    assert runnable[1].strip() == ".venv/bin/python -m pytest"


def test_every_linked_page_exists() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
