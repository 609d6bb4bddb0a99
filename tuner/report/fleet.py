"""The fleet verification's pages (`tune plan --verify`): `fleet.md` and `fleet.html` made from the same
blocks as the study's report, so the two carry the same tables (per policy: each N tried; per replica at
the verified N) and the HTML page has the report's style; `fleet.json` and the timeline plot beside them."""

from __future__ import annotations

from pathlib import Path

from tuner.fleet.measure import fmt_ms
from tuner.fleet.render import lines, timeline_svg
from tuner.fleet.verify import FleetVerification
from tuner.report.render import Block, page_html, page_markdown

TIMELINE = "fleet-timeline"


def fleet_blocks(v: FleetVerification, timeline: bool) -> list[Block]:
    """The verdict lines, then a section per routing policy, then the scenarios' timeline."""
    out = [Block("h1", "Fleet verification"), Block("ul", rows=[[x] for x in lines(v)])]
    for p in v.policies:
        out.append(Block("h2", f"Routing policy {p.policy}"))
        rows = [["N", "attainment", "p99 TTFT", "p99 TPOT", "hit rate", "errors"]]
        rows += [[str(c.replicas), f"{c.attainment:.4f}", fmt_ms(c.p99_ttft_ms), fmt_ms(c.p99_tpot_ms),
                  f"{c.prefix_hit_rate:.2f}" if c.prefix_hit_rate is not None else "n/a", str(c.errors)]
                 for c in p.checks]
        out.append(Block("table", rows=rows))
        best = next((c for c in p.checks if c.replicas == p.verified_n), None)
        if best is None:
            out.append(Block("p", "No N tried met the SLO under this policy."))
            continue
        out.append(Block("p", f"Per replica at N = {best.replicas}:"))
        per = [["replica", "share", "hit rate", "attainment", "p99 TTFT", "p99 TPOT"]]
        per += [[str(r.replica), f"{r.share:.3f}", f"{r.prefix_hit_rate:.2f}" if r.prefix_hit_rate is not None
                 else "n/a", f"{r.attainment:.4f}" if r.attainment is not None else "n/a", fmt_ms(r.p99_ttft_ms),
                 fmt_ms(r.p99_tpot_ms)] for r in best.per_replica]
        out.append(Block("table", rows=per))
    if timeline:
        out += [Block("h2", "Scenarios over time"),
                Block("fig", "Replicas serving and starting, the summed queue and the offered rate; shaded: "
                             "10 s windows that broke the SLO", lang=TIMELINE)]
    return out


def write_fleet(v: FleetVerification, out: Path) -> list[Path]:
    """fleet.json, fleet.md, fleet.html and fleet-timeline.svg under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    svg = timeline_svg(v)
    files = [out / "fleet.json", out / "fleet.md", out / "fleet.html"]
    files[0].write_text(v.model_dump_json(indent=2))
    if svg:
        (out / f"{TIMELINE}.svg").write_text(svg)
        files.append(out / f"{TIMELINE}.svg")
    page = fleet_blocks(v, timeline=svg is not None)
    files[1].write_text(page_markdown(page, fig_src="{}.svg"))
    files[2].write_text(page_html(f"Fleet verification: {v.run_dir}", page, {TIMELINE: svg} if svg else {}))
    return files
