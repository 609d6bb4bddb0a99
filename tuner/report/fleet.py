"""The fleet verification's pages (`tune plan --verify`): `fleet.md` and `fleet.html` made from the same
blocks as the study's report, so the two carry the same tables (per policy: each N tried; per replica at
the verified N) and the HTML page has the report's style; `fleet.json` and the timeline plot beside them."""

from __future__ import annotations

from pathlib import Path

from tuner.fleet.measure import fmt_ms
from tuner.fleet.render import head_line, policy_lines, tail_lines, timeline_svg
from tuner.fleet.verify import FleetVerification
from tuner.report.render import Block, page_html, page_markdown

TIMELINE = "fleet-timeline"


def fleet_blocks(v: FleetVerification, timeline: bool) -> list[Block]:
    """What was verified, then a section per routing policy (its own lines under its heading: the
    terminal's indented lines, flattened into one list, lost which policy they were of), then what was
    run under the chosen policy, and the scenarios' timeline."""
    out = [Block("h1", "Fleet verification"), Block("p", head_line(v)[0].upper() + head_line(v)[1:] + ".")]
    for p in v.policies:
        out += [Block("h2", f"Routing policy {p.policy}"), Block("ul", rows=[[x] for x in policy_lines(v, p)]),
                Block("p", f"Each N tried at the peak ({v.peak:g} req/s):")]
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
    under = f" (routing policy {v.scenarios[0].policy})" if v.scenarios else ""
    out += [Block("h2", f"Spare, scenarios, autoscaling and cost{under}"),
            Block("ul", rows=[[x] for x in tail_lines(v)])]
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
