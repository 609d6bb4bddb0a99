"""The fleet verification's pages (`tune plan --verify`): `fleet.md` and `fleet.html` made from the same
blocks as the study's report, so the two carry the same tables (per policy: each N tried; per replica at
the verified N) and the HTML page has the report's style; `fleet.json` and the timeline plot beside them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tuner.fleet.measure import fmt_ms  # noqa: E402
from tuner.fleet.render import head_line, policy_lines, tail_lines  # noqa: E402
from tuner.fleet.verify import FleetVerification, Scenario  # noqa: E402
from tuner.report.plots import RC, legend, svg  # noqa: E402
from tuner.report.render import Block, page_html, page_markdown  # noqa: E402

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
    chart = timeline_svg(v)
    files = [out / "fleet.json", out / "fleet.md", out / "fleet.html"]
    files[0].write_text(v.model_dump_json(indent=2))
    if chart:
        (out / f"{TIMELINE}.svg").write_text(chart)
        files.append(out / f"{TIMELINE}.svg")
    page = fleet_blocks(v, timeline=chart is not None)
    files[1].write_text(page_markdown(page, fig_src="{}.svg"))
    files[2].write_text(page_html(f"Fleet verification: {v.run_dir}", page, {TIMELINE: chart} if chart else {}))
    return files


def timeline_svg(v: FleetVerification) -> str | None:
    """One panel per scenario: offered rate, replicas serving and starting, summed waiting queue, and
    the 10 s windows whose attainment broke the SLO (shaded)."""
    if not v.scenarios:
        return None
    with plt.rc_context(RC):
        fig, axes = plt.subplots(len(v.scenarios), 1, figsize=(8, 2.6 * len(v.scenarios) + 0.4), squeeze=False)
        twins = [_panel(ax, s, v.target) for ax, s in zip(axes[:, 0], v.scenarios)]
        legend(fig, list(axes[:, 0]) + twins, where="outside upper center")
        return svg(fig)


def _panel(ax, s: Scenario, target: float):
    """One scenario on `ax` (replicas) and a twin axis (queue, rate), which it returns for the legend."""
    t = [x[0] for x in s.timeline]
    for start, att, n in s.windows:
        if n and att < target:
            ax.axvspan(start, start + 10.0, color="#d62728", alpha=0.15, lw=0)
    ax.step(t, [x[1] for x in s.timeline], where="post", color="#1f77b4", label="replicas serving")
    ax.step(t, [x[1] + x[2] for x in s.timeline], where="post", color="#1f77b4", ls=":", label="+ starting")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    ax2.plot(t, [x[3] for x in s.timeline], color="#ff7f0e", lw=0.8, label="summed waiting")
    ends = [p[0] for p in s.profile[1:]] + [max(t, default=0.0)]
    for (a, rate), b in zip(s.profile, ends):
        ax2.hlines(rate, a, b, color="#2ca02c", lw=1.2, label="offered req/s" if a == 0 else None)
    ax2.set_ylabel("waiting / req/s")
    ax.set_title(textwrap.fill(f"{s.name} ({s.policy}): {s.what} - SLO broken {s.broken_s:g} s (shaded)", 110), fontsize=8)
    ax.set_xlabel("seconds")
    ax2.grid(False)
    return ax2
