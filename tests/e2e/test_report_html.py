"""The report's HTML opened in headless Chromium: it renders its charts and asks the network for nothing.

Chromium runs with every host mapped to NOTFOUND, so nothing could be fetched anyway, and with a NetLog,
so any request the page *tried* is seen: a request the page starts carries the file:// page in its
network isolation key (Chromium's own background requests carry none). A control page with one remote
image and one remote stylesheet proves the detector sees what it should. The screenshot is kept under
`test-artifacts/` for a person (or CI) to look at.
"""

from __future__ import annotations

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
    # knob-by-knob shares where a step was attributed
    rep = json.loads((run / "report.json").read_text())
    twin = rep["twin"]
    assert len(imgs) == text.count("<img ") == 5 + bool(twin and twin["verified"]) + bool(rep["attribution"])

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
