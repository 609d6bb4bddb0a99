"""The results pages hold together: every section is a registered part with a dated header and a page, no
part file or note is left out of the registry, the index (benchmarks/RESULTS.md) has one row per current
section whose figures are read from that section, every link on the pages resolves, and the pages on disk are
exactly what the parts assemble to (a hand edit of a page, or a part changed without
`python benchmarks/run_all.py --assemble`, fails here). Nothing here runs a benchmark."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _page  # noqa: E402
from _parts import KINDS, NOTEBOOK, PAGES, PARTS, Figure  # noqa: E402

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


PAGES_NOW = _page.assemble()


def test_the_pages_are_what_their_parts_assemble_to() -> None:
    for path, text in PAGES_NOW.items():
        assert path.exists() and path.read_text() == text, (
            f"{path.relative_to(BENCH.parent)} differs from its parts: edit the part under "
            "benchmarks/results/sections/ (or its notes, or benchmarks/_parts.py), then "
            "`python benchmarks/run_all.py --assemble`")
    assert not _page.stale_pages(PAGES_NOW), "a page no longer assembled: `run_all.py --assemble` removes it"


def test_every_section_appears_on_its_page_with_its_date() -> None:
    for p in PARTS:
        pf = _page.read_part(p.name)
        page = PAGES_NOW[_page.page_path(_page.page_of(p))]
        assert f"## {p.title}\n\n*Measured {pf.header['measured']} on commit `{pf.header['commit']}`" in page


def test_every_current_part_has_a_page_and_a_headline_and_notebook_parts_neither() -> None:
    assert not {"analysis", "regeneration", NOTEBOOK} & set(PAGES), "a page name the assembly uses itself"
    for p in PARTS:
        if p.notebook:
            assert not p.page and not p.headline, f"{p.name}: a notebook part is on the notebook's page only"
        else:
            assert p.page in PAGES and p.headline, f"{p.name}: needs a page (one of {list(PAGES)}) and a headline"


def test_the_index_has_one_row_per_current_section_with_its_figures_and_date() -> None:
    index = PAGES_NOW[_page.PAGE]
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    current = [p for p in PARTS if not p.notebook]
    assert len(rows) == len(current) and len(index.splitlines()) < 100, "the index stays one short table"
    for p, row in zip(sorted(current, key=lambda p: list(PAGES).index(p.page)), rows):
        pf = _page.read_part(p.name)
        said, target = _page.headline(p, pf)
        assert row == (f"| [{p.title}](results/{p.page}.md#{_page._anchor(p.title)}) | {_page._cell(said)} | "
                       f"{_page._cell(target)} | {pf.date} |"), p.name
    for p in PARTS:
        assert (p.title in index) != p.notebook, p.name  # notebook parts only on their own page


def test_headline_figures_come_from_the_section_and_a_missing_one_stops_the_assembly() -> None:
    """The index's words are filled from the section's own text; a section whose wording no longer has a
    figure fails, naming the part file and the pattern, instead of leaving a stale figure on the index."""
    body = ("speed-up 5302x real time (target >= 100x)\n"
            "| chat | 7.5 |\n| rag | 3.2 |\n")
    pf = _page.PartFile({"name": "no_such_part", "measured": "2026-01-01"}, body)
    part = dataclasses.replace(PARTS[0], name="no_such_part", headline=(
        Figure(r"speed-up (?P<x>\d+)x real time \(target >= (?P<t>\d+)x\)", "{x}x real time", target="at least {t}x",
               met=lambda g: float(g["x"]) >= float(g["t"])),
        Figure(r"^\| (?P<sc>\w+) \| (?P<c>[\d.]+) \|$", "{sc} {c}", each=True, label="capacity: "),
        Figure(r"^\| \w+ \| (?P<c>[\d.]+) \|$", lambda ms: f"{len(ms)} scenarios"),
        Figure(r"^\| \w+ \| (?P<c>[\d.]+) \|$", target="above 5", met=lambda g: float(g["c"]) > 5, each=True)))
    assert _page.headline(part, pf) == ("5302x real time; capacity: chat 7.5, rag 3.2; 2 scenarios",
                                         "at least 100x: met; above 5: met on 1 of 2")
    missing = dataclasses.replace(part, headline=(Figure(r"no such words", "x"),))
    with pytest.raises(_page.PartError, match=r"sections/no_such_part\.md: headline figure not found"):
        _page.headline(missing, pf)


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """The heading anchors GitHub makes for a page (headings inside fenced code are not headings)."""
    out, fenced = set(), False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            out.add(_page._anchor(line.lstrip("#").strip()))
    return out


def test_every_link_on_the_pages_resolves() -> None:
    """Relative links (to pages, their sections' anchors, plots and files) land on something that exists,
    as GitHub resolves them from the page's own folder."""
    for path, text in PAGES_NOW.items():
        for target in _LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.relative_to(BENCH.parent)}: link {target!r} names no file"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(PAGES_NOW.get(dest) or dest.read_text()), f"{path.name}: {target!r}"


def test_a_page_no_longer_assembled_is_found_stale(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_page, "RESULTS", tmp_path)
    (tmp_path / "old.md").write_text(f"# Old\n\n{_page.GENERATED}\n")
    (tmp_path / "hand.md").write_text("# Written by hand\n")
    (tmp_path / "kept.md").write_text(f"# Kept\n\n{_page.GENERATED}\n")
    assert _page.stale_pages({tmp_path / "kept.md": ""}) == [tmp_path / "old.md"]


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
