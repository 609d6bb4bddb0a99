"""The docs site builds strictly (`mkdocs build --strict`, as CI does): every page in the nav, every link
and anchor found, the generated pages (home, the results index and its pages, CLI and file-format
reference) made from the code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs", reason="mkdocs-material is in the test extra: pip install -e '.[test]'")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_its_generated_pages(tmp_path: Path) -> None:
    r = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("tune worker", "tune report", "tune plan", "tune gate", "tune bench", "tune workload synth"):
        assert f"<code>{command}</code>" in cli, command
    assert "<code>--max-trials</code>" in cli and "<code>--precision</code>" in cli
    files = (tmp_path / "site" / "reference" / "files" / "index.html").read_text()
    assert "max_ms" in files and "max_num_seqs" not in files or "KnobValues" in files
    home = (tmp_path / "site" / "index.html").read_text()
    assert "slo-tuner" in home and "docs/twin.md" not in home  # README links point at the site's pages
    assert (tmp_path / "site" / "results" / "index.html").exists()
    for page in (ROOT / "benchmarks" / "results").glob("*.md"):  # the pages the results index links to
        assert (tmp_path / "site" / "results" / page.stem / "index.html").exists(), page.name


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The same site with one page that links to a page that is not there: the build stops."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "twin.md").write_text((docs / "twin.md").read_text() + "\nSee [the gone page](no-such-page.md).\n")
    config = (ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}").replace(
        "  - tools/docs_hooks.py", f"  - {ROOT / 'tools' / 'docs_hooks.py'}")
    (tmp_path / "mkdocs.yml").write_text(config)
    r = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert r.returncode != 0 and "no-such-page.md" in r.stderr + r.stdout
