"""benchmarks/RESULTS.md holds together: every section is a registered part with a dated header, no part
file or note is left out of the registry, and the page on disk is exactly what its parts assemble to (a hand
edit of RESULTS.md, or a part changed without `python benchmarks/run_all.py --assemble`, fails here).
Nothing here runs a benchmark."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _page  # noqa: E402
from _parts import KINDS, PARTS  # noqa: E402

spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
run_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_all)


def test_part_names_are_unique_and_kinds_known() -> None:
    names = [p.name for p in PARTS]
    assert len(names) == len(set(names)), names
    assert {p.kind for p in PARTS} <= set(KINDS)


@pytest.mark.parametrize("part", PARTS, ids=[p.name for p in PARTS])
def test_every_part_has_a_dated_header(part) -> None:
    pf = _page.read_part(part.name)
    assert pf.header["name"] == part.name
    assert pf.date[:2] == "20" and pf.body.strip(), part.name


@pytest.mark.parametrize("part", PARTS, ids=[p.name for p in PARTS])
def test_every_run_part_names_a_script_that_exists(part) -> None:
    if part.kind == "record":
        assert part.how, f"{part.name}: a record part says how it was run"
    else:
        assert part.command and (BENCH.parent / part.command[0]).is_file(), part.command


def test_no_orphan_part_files_or_notes() -> None:
    registered = {p.name for p in PARTS}
    for folder in (_page.SECTIONS, _page.NOTES):
        orphans = sorted(f.name for f in folder.iterdir() if f.stem not in registered)
        assert not orphans, f"{folder.relative_to(BENCH.parent)}: not in benchmarks/_parts.py: {orphans}"


def test_analysis_is_dated() -> None:
    pf = _page.parse_part((BENCH / "ANALYSIS.md").read_text(), "benchmarks/ANALYSIS.md")
    assert pf.date[:2] == "20"


def test_the_page_is_what_its_parts_assemble_to() -> None:
    assert (BENCH / "RESULTS.md").read_text() == _page.assemble(), (
        "benchmarks/RESULTS.md differs from its parts: edit the part under benchmarks/results/sections/ "
        "(or its notes), then `python benchmarks/run_all.py --assemble`")


def test_every_section_appears_on_the_page_with_its_date() -> None:
    page = (BENCH / "RESULTS.md").read_text()
    for p in PARTS:
        pf = _page.read_part(p.name)
        assert f"## {p.title}\n\n*Measured {pf.header['measured']} on commit `{pf.header['commit']}`" in page


def test_a_header_without_a_date_names_the_file_and_field() -> None:
    text = _page.format_part({"name": "x", "measured": "yesterday", "commit": "abc", "wall": "1 s",
                              "command": "python x.py", "host": "h"}, "body")
    with pytest.raises(_page.PartError, match=r"x\.md: field 'measured' must start with a date"):
        _page.parse_part(text, "x.md")
    with pytest.raises(_page.PartError, match=r"x\.md: line 1: no '<!-- results-part' header"):
        _page.parse_part("body only\n", "x.md")
    with pytest.raises(_page.PartError, match=r"x\.md: line 4: expected one of"):
        _page.parse_part(text.replace("commit: abc", "commitabc"), "x.md")


def test_bad_invocations_exit_2_with_one_line_and_write_nothing(capsys, monkeypatch) -> None:
    monkeypatch.delenv("TUNER_VLLM_PYTHON", raising=False)
    before = (BENCH / "RESULTS.md").stat().st_mtime_ns
    cases = [(["--only", "no_such_part"], "--only: no part named no_such_part"),
             (["--only", "vllm_studies"], "recorded by hand"),
             (["--only", "client_vs_server_vllm"], "TUNER_VLLM_PYTHON"),
             (["--record", "no_such_part", "body.md", "--command", "x"], "no part named 'no_such_part'")]
    for argv, message in cases:
        assert run_all.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert (BENCH / "RESULTS.md").stat().st_mtime_ns == before


def test_all_selects_every_section_a_command_regenerates(monkeypatch) -> None:
    """`run_all.py --all` is the one command for the whole page: every part but the hand-recorded ones, the
    same as `--long --real`; its stated wall time is theirs."""
    monkeypatch.setenv("TUNER_VLLM_PYTHON", "python")
    monkeypatch.setenv("TUNER_TINY_MODEL", "model")
    monkeypatch.setenv("TUNER_REAL_MODEL", "model")

    def names(argv: list[str]) -> list[str]:
        ap_args = run_all.argparse.Namespace(only=None, long="--long" in argv, real="--real" in argv,
                                             all="--all" in argv)
        return [p.name for p in run_all.selected(ap_args)]

    runnable = [p.name for p in PARTS if p.kind != "record"]
    assert names(["--all"]) == names(["--long", "--real"]) == runnable
    assert names([]) == [p.name for p in PARTS if p.kind == "sim"]
    assert _page.full_regeneration_s() == sum(p.expected_s for p in PARTS if p.kind != "record")


def test_a_full_regeneration_is_told_from_a_partial_one() -> None:
    assert _page.is_full({"command": "python benchmarks/run_all.py --all"})
    assert _page.is_full({"command": "python benchmarks/run_all.py --real --long --fresh"})
    assert not _page.is_full({"command": "python benchmarks/run_all.py"})
    assert not _page.is_full({"command": "python benchmarks/run_all.py --long"})
    assert not _page.is_full({"command": "python benchmarks/run_all.py --all --only knee_search"})


def test_main_job_speed_refuses_an_unknown_base_commit(capsys) -> None:
    spec = importlib.util.spec_from_file_location("main_job_speed", BENCH / "main_job_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--base", "no-such-commit-anywhere", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--base: 'no-such-commit-anywhere' is not a commit" in err and len(err.splitlines()) == 1, err
    assert mod.main(["--runs", "0"]) == 2
    capsys.readouterr()
    assert mod.main(["--runs", "99999999"]) == 2 and mod.main(["--rank-runs", "-1"]) == 2
    assert "must be 1 to 20" in capsys.readouterr().err
