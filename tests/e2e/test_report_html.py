"""The report's HTML opened in headless Chromium: it renders its charts and asks the network for nothing.

Chromium runs with every host mapped to NOTFOUND, so nothing could be fetched anyway, and with a NetLog,
so any request the page *tried* is seen: a request the page starts carries the file:// page in its
network isolation key (Chromium's own background requests carry none). A control page with one remote
image and one remote stylesheet proves the detector sees what it should. The screenshot is kept under
`test-artifacts/` for a person (or CI) to look at.

Every text must be readable at the report's width (issue 62: a code line cut off at the right edge, an
axis label over the next panel, tick labels over an axis title, legends over data, tiny labels): a copy
of the page runs `layout_check.js` once loaded, which measures every text box as Chromium lays it out,
the charts' texts included, and names each text that overlaps another, runs past its chart, its box or
the page, is cut off by a scrolling box, or is drawn under 8 px, each box that scrolls, and each curve a
legend lies over. A control page with each fault proves the check sees them, and a page of the report's
blocks that it finds nothing in.
"""

from __future__ import annotations

import base64
import html as htmllib
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.e2e.test_report_cli import tuned_run

pytestmark = [pytest.mark.e2e, pytest.mark.chromium]

ARTIFACTS = ROOT / "test-artifacts"


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; CI runs "
                    ".ci/setup-chromium.sh)")
    return exe


def render(html: Path, work: Path, shot: Path, size: str = "1280,7000") -> list[str]:
    """Screenshot `html`; returns the URLs of the requests the page itself started."""
    work.mkdir(parents=True, exist_ok=True)
    netlog = work / "netlog.json"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={work / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
           f"--log-net-log={netlog}", f"--screenshot={shot}", f"--window-size={size}", html.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.exists(), f"chromium wrote no screenshot (exit {p.returncode}): {p.stderr[-2000:]}"
    log = json.loads(netlog.read_text())
    names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    urls = []
    for e in log["events"]:
        params = e.get("params") or {}
        if names.get(e["type"]) == "URL_REQUEST_START_JOB" and "file://" in str(
                params.get("network_isolation_key", "")):
            urls.append(params.get("url", ""))
    return [u for u in urls if not u.startswith(("file:", "data:"))]


LAYOUT_JS = Path(__file__).with_name("layout_check.js")


def layout_problems(page: Path, work: Path, width: int = 1280) -> list[str]:
    """What `layout_check.js` finds in `page` opened `width` px wide (a copy of it, the script appended)."""
    work.mkdir(parents=True, exist_ok=True)
    copy = work / f"{page.stem}.layout.html"
    text = page.read_text(encoding="utf-8")
    head, tail = text.rsplit("</body>", 1)
    copy.write_text(f"{head}<script>{LAYOUT_JS.read_text()}</script></body>{tail}", encoding="utf-8")
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={work / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--virtual-time-budget=5000", f"--window-size={width},1000", "--dump-dom", copy.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<html[^>]* data-layout="([^"]*)"', p.stdout)
    assert found, f"the layout check did not run (exit {p.returncode}): {p.stderr[-2000:]}"
    result = json.loads(htmllib.unescape(found.group(1)))
    assert "error" not in result, f"the layout check failed: {result.get('error')}"
    assert result["texts"] > 0, "the layout check found no text at all"
    charts = text.count('src="data:image/svg+xml;base64,')
    assert result["charts"] == charts, f"{result['charts']} of the page's {charts} charts were checked"
    return result["problems"]


def _png(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    return mpimg.imread(path)[..., :3]


def _tuned_pixels(img: np.ndarray) -> int:
    return int((np.abs(img - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=2) < 0.08).sum())


def test_detector_sees_a_page_that_fetches(tmp_path):
    page = tmp_path / "control.html"
    page.write_text('<html><body><img src="https://example.com/x.png">'
                    '<link rel="stylesheet" href="http://cdn.example.org/a.css"></body></html>')
    urls = render(page, tmp_path, tmp_path / "control.png", size="400,300")
    assert "https://example.com/x.png" in urls and "http://cdn.example.org/a.css" in urls


def _chart(*texts: tuple[float, float, str, float], legend: str | None = None) -> str:
    """A chart drawn as the report draws its charts, with texts (x, y, text, font size) where told and
    a legend at `legend` (matplotlib's loc) over the curve."""
    import matplotlib.pyplot as plt

    from tuner.report.plots import RC, svg

    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(5, 2.5))
        ax.plot([0, 1], [0, 1], label="a curve")
        for x, y, t, size in texts:
            ax.text(x, y, t, fontsize=size)
        ax.set_xlabel("x label")
        if legend:
            ax.legend(loc=legend)
        return svg(fig)


def _img(svg: str) -> str:
    return f'<img alt="chart" src="data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()}">'


def test_layout_check_sees_clipped_and_overlapping_text(tmp_path):
    """A control page with each fault the check looks for, in HTML and in the charts."""
    edge = ('<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60" viewBox="0 0 200 60">'
            '<text x="150" y="30" font-size="12">past the edge</text></svg>')
    crowded = _chart((0.3, 0.5, "one label", 9), (0.35, 0.5, "another label", 9), (0.1, 0.8, "tiny", 3),
                     legend="center")
    page = tmp_path / "control.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><style>p,pre,div,figure{position:absolute;margin:0}'
        '</style></head><body>'
        '<p style="top:10px;left:10px">first text here</p><p style="top:14px;left:30px">second text here</p>'
        '<pre style="top:60px;width:200px;overflow-x:auto">a code line longer than the 200 px of its box</pre>'
        '<div style="top:120px;left:1200px;white-space:nowrap">this runs off the page</div>'
        '<div style="top:160px;width:60px;white-space:nowrap">wider than its box</div>'
        f'<figure id="fig-crowded" style="top:200px">{_img(crowded)}</figure>'
        f'<figure id="fig-edge" style="top:500px">{_img(edge)}</figure></body></html>')
    said = "\n".join(layout_problems(page, tmp_path))
    for expected in ['overlap: <p> "first text here" and <p> "second text here"',
                     'outside: <pre> "a code line', 'is cut off by its <pre>', "overflow: <pre>",
                     'outside: <div> "this runs off the page" runs past the page',
                     "overflow: the page is", 'outside: <div> "wider than its box" runs past its <div>',
                     'small: fig-crowded: "tiny"', "covered: fig-crowded: a legend lies over the curve line2d_",
                     'fig-edge: "past the edge" runs past its chart\'s edge']:
        assert expected in said, f"{expected!r} not in:\n{said}"
    assert re.search(r'overlap: fig-crowded: "(one|another) label" and fig-crowded: "(one|another) label"', said)


def test_layout_check_passes_a_page_in_the_reports_style(tmp_path):
    """The report's own blocks (a long code line, a wide table, a chart) at the report's width: nothing
    found, so what the check finds in a report is the report's."""
    from tuner.report.render import Block, page_html

    line = "feasibility: every threshold clears its single-stream floor " * 5
    page = [Block("h1", "A page"), Block("p", "A paragraph with `code` in it. " * 20),
            Block("code", line + "\nsecond line", lang="text"),
            Block("table", rows=[["knob", "value"], ["max_num_seqs", "512"], ["a " * 80, "b"]]),
            Block("ul", rows=[["one"], ["two"]]), Block("fig", "A chart", lang="c")]
    (tmp_path / "page.html").write_text(page_html("A page", page, {"c": _chart((0.1, 0.8, "a label", 9))}))
    assert layout_problems(tmp_path / "page.html", tmp_path) == []


def test_report_html_renders_offline_with_its_charts(tmp_path_factory, tmp_path):
    run = tuned_run(tmp_path_factory, 4)
    html = tmp_path / "report.html"
    shutil.copy(run / "report.html", html)           # alone: nothing beside it to load
    text = html.read_text()
    # statically: no resource URL in src/href, no script, every chart inline
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", text, flags=re.I)
    assert "<script" not in text.lower()
    imgs = re.findall(r'<img [^>]*src="data:image/svg\+xml;base64,[A-Za-z0-9+/=]+"', text)
    # five charts, one (predicted against measured knee curves) where the twin verified a trial, and the
    # knob-by-knob shares where a step was attributed and some share is known (else a sentence says so)
    rep = json.loads((run / "report.json").read_text())
    twin = rep["twin"]
    shares = any(r["share_pct"] is not None for s in rep["attribution"] for r in s["rows"])
    assert len(imgs) == text.count("<img ") == 5 + bool(twin and twin["verified"]) + shares

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    shot.unlink(missing_ok=True)
    urls = render(html, tmp_path, shot)
    assert urls == [], f"the report tried to fetch {urls}"
    img = _png(shot)
    assert img.shape[:2] == (7000, 1280)  # tall enough for the charts below the recommendation's tables
    assert shot.stat().st_size > 100_000
    ink = (img < 0.9).any(axis=2)
    assert ink.mean() > 0.03, "the page is (nearly) blank"
    assert len(np.unique((img * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 100
    # the charts drew: the tuned configuration's colour (#1f77b4) covers a visible area, and none of
    # it is left when the same page is rendered without its images
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", text))
    render(bare, tmp_path / "bare", tmp_path / "bare.png")
    assert _tuned_pixels(img) > 500 and _tuned_pixels(_png(tmp_path / "bare.png")) < 20


def test_fleet_timeline_renders_offline_in_the_browser(tmp_path):
    """`tune plan --verify`'s fleet.html (issue 39: the autoscaling timeline in the report) opened in
    Chromium: nothing fetched, and the inline timeline draws (the page without it has far less ink)."""
    from tests.e2e.test_fleet_cli import RUN
    from tests.e2e.test_workload_cli import tune

    _chromium()  # skip before the study's fleet is simulated when there is no browser
    out = tmp_path / "fleet"
    p = tune("plan", "--verify", RUN, "--peak-rate", "5", "--policy", "round_robin", "--surge-s", "20",
             "--cold-start-s", "20", "--fleet-out", out, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    text = (out / "fleet.html").read_text()
    assert 'src="data:image/svg+xml;base64,' in text and "<script" not in text.lower()
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "fleet-screenshot.png"
    shot.unlink(missing_ok=True)
    assert render(out / "fleet.html", tmp_path / "page", shot, size="1280,2400") == []
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<img [^>]*>", "", text))
    render(bare, tmp_path / "bare", tmp_path / "bare.png", size="1280,2400")
    ink = (_png(shot) < 0.9).any(axis=2).sum()
    bare_ink = (_png(tmp_path / "bare.png") < 0.9).any(axis=2).sum()
    assert ink > bare_ink + 40_000, f"the timeline did not draw ({ink} inked pixels, {bare_ink} without it)"
    assert layout_problems(out / "fleet.html", tmp_path / "layout") == []


def test_report_html_text_is_readable_at_the_reports_width(tmp_path_factory, tmp_path):
    run = tuned_run(tmp_path_factory, 4)
    html = tmp_path / "report.html"
    shutil.copy(run / "report.html", html)
    assert layout_problems(html, tmp_path / "layout") == []


def test_the_example_reports_text_is_readable(tmp_path):
    """The shipped example study (reports/: the twin's chart, the paired check's tables) rebuilt from its
    storage, as `tune report` rebuilds it."""
    from tests.e2e.test_fleet_cli import RUN
    from tuner.report import write_report

    _chromium()
    write_report(RUN, tmp_path / "report")
    assert layout_problems(tmp_path / "report" / "report.html", tmp_path / "layout") == []
