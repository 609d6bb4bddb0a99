"""The run's report: what was found, what it is worth, and how much of it to trust.

`build_report(run_dir)` reads the study storage and returns the `Report` (Pydantic); `write_report(run_dir)`
writes `report.md`, a self-contained `report.html`, `report.json`, `tuned-config.yaml` and `plots/*.svg`
into the run directory. The report never writes the gate (it reads the storage alone and imports no
measurement code): `tune report RUN_DIR` and the study write `gate.yaml` first, and the report says
whether there is one.
"""

from __future__ import annotations

from pathlib import Path

from tuner.inputs import check_out_dir
from tuner.report.build import build_report
from tuner.report.model import Report
from tuner.report.render import to_html, to_markdown
from tuner.storage.reader import storage_url

__all__ = ["build_report", "write_report", "Report"]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Report:
    """Build the report and write every file; returns the `Report`. `out_dir` defaults to `run_dir`."""
    from tuner.report.plots import all_plots  # matplotlib: only when the plots are drawn

    storage_url(run_dir)  # a run directory of `tune`, checked before anything is created
    out = check_out_dir(out_dir, "--out") if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep = build_report(run_dir)
    rep.gate_written = (out / "gate.yaml").exists()
    svgs = all_plots(rep)
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    for name, svg in svgs.items():
        (plots / f"{name}.svg").write_text(svg, encoding="utf-8")
    (out / "report.md").write_text(to_markdown(rep, set(svgs)), encoding="utf-8")
    (out / "report.html").write_text(to_html(rep, svgs), encoding="utf-8")
    (out / "report.json").write_text(rep.model_dump_json(indent=2) + "\n", encoding="utf-8")
    if rep.status == "tuned":
        (out / "tuned-config.yaml").write_text(rep.config_yaml, encoding="utf-8")
    else:  # a config file of vLLM's defaults would read as "the defaults were best"
        (out / "tuned-config.yaml").unlink(missing_ok=True)
    return rep
