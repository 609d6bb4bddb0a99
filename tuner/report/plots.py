"""The report's charts, drawn with matplotlib's Agg backend into SVG text.

SVG because it is small, sharp at any zoom and needs no fonts (glyphs are drawn as paths), so the HTML can
embed it and stay self-contained: nothing in a chart refers to anything outside it. Each function takes
the `Report` and returns SVG text, or None when the study holds nothing to draw.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from tuner.report.layout import layout_problems  # noqa: E402
from tuner.report.model import ConfigSummary, Report  # noqa: E402
from tuner.twin.workers import Workers  # noqa: E402

BASE, TUNED = "#7f7f7f", "#1f77b4"
STATE_COLOR = {"accepted": "#2ca02c", "COMPLETE": "#9ecae1", "PRUNED": "#ff7f0e", "FAIL": "#d62728",
               "RUNNING": "#bbbbbb", "WAITING": "#bbbbbb"}
RC = {"svg.hashsalt": "slo-tuner", "svg.fonttype": "path", "font.size": 9, "axes.grid": True,
      "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
      # labels, a twin axis's included, never run into the next panel; legends sit outside the data
      "figure.constrained_layout.use": True}
#: When a list, every chart drawn appends what is wrong with its layout (`layout_problems`): the test of
#: every chart sets it; the report is drawn without the check.
PROBLEMS: list[str] | None = None


class PlainLogFormatter(LogFormatter):
    """A log axis's tick labels as plain numbers ("200", "0.5"): the ticks matplotlib's default labels
    (decades, and the minor ticks it picks on a short axis), without its mathtext ("$10^{2}$"), whose
    parser was a quarter of the report's drawing time. A latency in ms reads better as 200 than as 2x10^2."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def _plain_log_ticks(fig) -> None:
    for ax in fig.axes:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_major_formatter(PlainLogFormatter(base=10))
                axis.set_minor_formatter(PlainLogFormatter(base=10, labelOnlyBase=False))


def legend(fig, axes, ncol: int = 4, where: str = "outside lower center") -> None:
    """One legend for the figure, outside every panel (a legend inside covers data), each label once."""
    seen: dict = {}
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label and not label.startswith("_"):
                seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc=where, ncol=min(ncol, len(seen)), fontsize=7, frameon=False)


def svg(fig) -> str:
    _plain_log_ticks(fig)
    if PROBLEMS is not None:
        PROBLEMS.extend(layout_problems(fig))
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    # the RDF metadata block and the DOCTYPE name web addresses (vocabularies, the DTD): neither is
    # needed, and the report must not point outside itself; what remains are the xmlns identifiers
    text = re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)


def _series(c: ConfigSummary, f):
    pts = [(r.rate, f(r), r.passed) for r in c.knee]
    return [(x, y, ok) for x, y, ok in pts if y is not None and math.isfinite(y)]


def _plot_config(ax, c: ConfigSummary, f, color: str, label: str) -> None:
    pts = _series(c, f)
    if not pts:
        return
    xs, ys, ok = zip(*pts)
    ax.plot(xs, ys, "-", color=color, lw=1.5, label=label)
    ax.scatter([x for x, _, p in pts if p], [y for _, y, p in pts if p], color=color, s=22, zorder=3)
    ax.scatter([x for x, _, p in pts if not p], [y for _, y, p in pts if not p], facecolors="white",
               edgecolors=color, s=22, zorder=3)
    if c.capacity_rps:
        ax.axvline(c.capacity_rps, color=color, ls=":", lw=1)
    if c.saturation_rps and ax.get_ylabel().startswith("goodput"):
        ax.axhline(c.saturation_rps, color=color, ls="-.", lw=0.8,
                   label=f"served when all sent at once ({c.saturation_rps:.3g}/s)")


def _other(rep: Report) -> tuple[ConfigSummary, str]:
    """The configuration drawn beside the baseline, as the headline compares them: the recommended one,
    or, when that is vLLM's defaults, the best measured one (labelled not significant)."""
    if rep.tuned.trial == rep.baseline.trial and rep.best is not None and rep.best.trial is not None:
        return rep.best, rep.best.label
    return rep.tuned, rep.tuned.label


def knee_curves(rep: Report) -> str | None:
    """Offered rate vs goodput and vs p99 TTFT/TPOT, baseline and tuned, SLO thresholds as lines.
    Filled points passed the SLO, hollow ones did not; dotted verticals mark each capacity."""
    other, label = _other(rep)
    if not rep.baseline.knee and not other.knee:
        return None
    panels = [("goodput (req/s)", lambda r: r.goodput, None)]
    for m in ("ttft", "tpot"):
        th = (rep.slo.get(m) or {}).get("max_ms")
        panels.append((f"p99 {m.upper()} (ms)", lambda r, m=m: r.p99_ms.get(m), th))
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, len(panels), figsize=(12, 3.6))
        for ax, (ylabel, f, th) in zip(axes, panels):
            ax.set_ylabel(ylabel)
            same = other.trial == rep.baseline.trial
            _plot_config(ax, rep.baseline, f, BASE, "baseline (defaults)")
            if not same:
                _plot_config(ax, other, f, TUNED, label)
            if th:
                ax.axhline(th, color="#d62728", ls="--", lw=1, label=f"SLO {th:g} ms")
                ax.set_yscale("log")
            else:
                lim = max((r.rate for r in rep.baseline.knee + other.knee), default=1)
                ax.plot([0, lim], [0, lim], color="#cccccc", lw=0.8, label="goodput = offered")
            ax.set_xlabel("offered rate (req/s, open loop)")
            ax.set_ylabel(ylabel)
        legend(fig, axes)
        fig.suptitle("Knee curves: the capacity is the last filled point before the SLO breaks")
        return svg(fig)


def _trials_width(rep: Report) -> float:
    """Inches for a chart with a column per trial: wider with more trials, up to the report's width (12.5
    in): a wider chart is shrunk to fit the page, and its labels with it, below what can be read."""
    return min(12.0, max(6.0, 0.55 * len(rep.trials) + 2))


def _status(t) -> str:
    return "accepted" if t.accepted else t.state


def capacity_per_trial(rep: Report) -> str | None:
    """Capacity of every trial in order, coloured by outcome, with the incumbent as a step line."""
    if not rep.trials:
        return None
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(_trials_width(rep), 3.4))
        xs = [t.number for t in rep.trials]
        for t in rep.trials:
            cap = t.capacity_rps or 0.0
            if t.raced_out and not cap and t.capacity_upper_rps:
                # raced out: an outline up to the rate it failed at (the incumbent's capacity)
                ax.bar(t.number, t.capacity_upper_rps, width=0.7, fill=False, hatch="//",
                       edgecolor=STATE_COLOR["PRUNED"])
                continue
            ax.bar(t.number, cap, color=STATE_COLOR.get(_status(t), "#bbbbbb"), width=0.7,
                   hatch="//" if t.state == "PRUNED" else None, edgecolor="white")
            if t.state == "FAIL" or not t.launched:
                ax.text(t.number, 0, "x", color=STATE_COLOR["FAIL"], ha="center", va="bottom", fontsize=11)
        inc, best = [], None
        for t in rep.trials:
            if t.accepted and t.capacity_rps is not None:
                best = t.capacity_rps
            inc.append(best if best is not None else math.nan)
        ax.step(xs, inc, where="mid", color="#2ca02c", lw=1.2, label="incumbent")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{t.number} {(t.changed_knob or t.role)}" for t in rep.trials],
                           fontsize=6.5, rotation=45, ha="right")
        ax.set_ylabel("capacity (req/s within the SLO)")
        for label, key in [("accepted", "accepted"), ("rejected", "COMPLETE"), ("raced out", "PRUNED"),
                           ("failed", "FAIL")]:
            ax.bar([math.nan], [math.nan], color=STATE_COLOR[key], label=label)
        legend(fig, [ax], ncol=5)
        ax.set_title("Capacity per trial, in the order the search ran them (outline: raced out at that "
                     "rate)", fontsize=9)
        return svg(fig)


def _encode(values: list) -> tuple[list[float], list[str] | None]:
    """Numbers stay numbers; strings and booleans become category positions with their labels."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return [math.nan if v is None else float(v) for v in values], None
    cats = sorted({str(v) for v in present})
    return [math.nan if v is None else float(cats.index(str(v))) for v in values], cats


def knob_trajectory(rep: Report) -> str | None:
    """Each knob that any trial set, per trial ("def": unset, vLLM's default), and above the top panel the
    diagnosis of each accepted trial. Its labels are the report's smallest readable size (9 and 8 pt: the
    issue found them tiny at 7 and 8)."""
    names = [k for k in dict.fromkeys(k for t in rep.trials for k in t.knobs)]
    if not names:
        return None
    with plt.rc_context(RC):
        fig, axes = plt.subplots(len(names), 1, figsize=(_trials_width(rep), 1.3 * len(names) + 0.8), sharex=True,
                                 squeeze=False)
        xs = [t.number for t in rep.trials]
        for ax, name in zip(axes[:, 0], names):
            ys, cats = _encode([t.knobs.get(name) for t in rep.trials])
            for x, y, t in zip(xs, ys, rep.trials):
                if math.isnan(y):
                    ax.text(x, 0.5, "def", ha="center", va="center", fontsize=9, color="#888888",
                            transform=ax.get_xaxis_transform())
                else:
                    ax.scatter([x], [y], color=STATE_COLOR.get(_status(t), "#bbbbbb"), s=28, zorder=3,
                               edgecolors="black", linewidths=0.4)
                if ax is axes[0, 0] and t.accepted and t.diagnosis is not None:
                    ax.annotate(t.diagnosis.kind, (x, 1.0), xycoords=("data", "axes fraction"),
                                fontsize=8, ha="left", va="bottom", rotation=30, color="#555555")
            if cats:
                ax.set_yticks(range(len(cats)))
                ax.set_yticklabels(cats, fontsize=9)
            ax.set_ylabel(name, fontsize=9, rotation=0, ha="right", va="center")
        # a trial's label ("def" included) never sits on the axis line at either end
        axes[-1, 0].set_xlim(min(xs) - 0.6, max(xs) + 0.6)
        axes[-1, 0].set_xticks(xs)
        axes[-1, 0].set_xlabel("trial (colour: green accepted, blue rejected, orange raced out, red failed;"
                               " label: diagnosis of an accepted trial)")
        fig.suptitle("Knob trajectory")
        return svg(fig)


def _rate(cap: float | None) -> str:
    """A capacity in a legend; None where the paired check found none on every window (the knee's
    latencies are still drawn)."""
    return f"{cap:.3g} req/s" if cap is not None else "no paired capacity"


def latency_cdfs(rep: Report) -> str | None:
    """Latency CDFs at each configuration's capacity, SLO thresholds as vertical lines."""
    other, label = _other(rep)
    t, b = other.latency_at_capacity, rep.baseline.latency_at_capacity
    if t is None or not t.values_ms:
        return None
    metrics = [m for m in ("ttft", "tpot", "itl", "e2el") if m in t.values_ms]
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 3.0), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            if b is not None and m in b.values_ms and rep.baseline.trial != other.trial:
                ax.plot(b.values_ms[m], b.q, color=BASE, label=f"baseline @ {_rate(rep.baseline.capacity_rps)}")
            ax.plot(t.values_ms[m], t.q, color=TUNED, label=f"{label} @ {_rate(other.capacity_rps)}")
            th = (rep.slo.get(m) or {}).get("max_ms")
            if th:
                ax.axvline(th, color="#d62728", ls="--", lw=1, label=f"SLO {th:g} ms")
            ax.set_xlabel(f"{m.upper()} (ms)")
            ax.set_ylabel("fraction of requests")
            ax.set_ylim(0, 1.01)
        legend(fig, list(axes[0]))
        fig.suptitle("Latency distribution at capacity")
        return svg(fig)


def timeseries(rep: Report) -> str | None:
    """Running / waiting requests and KV-cache usage over the load run just above each knee: what the
    engine was doing when the SLO broke (the evidence the diagnosis reads)."""
    other, _ = _other(rep)
    confs = [c for c in (rep.baseline, other) if c.knee_metrics and c.knee_metrics.samples]
    if rep.baseline.trial == other.trial:
        confs = confs[:1]
    if not confs:
        return None
    with plt.rc_context(RC):
        fig, axes = plt.subplots(1, len(confs), figsize=(6 * len(confs), 3.2), squeeze=False)
        twins = []
        for ax, c in zip(axes[0], confs):
            s = c.knee_metrics.samples
            t = [x.t for x in s]
            ax.plot(t, [x.running for x in s], color="#1f77b4", lw=1, label="running")
            ax.plot(t, [x.waiting for x in s], color="#ff7f0e", lw=1, label="waiting")
            ax.set_xlabel("time in the load run (s)")
            ax.set_ylabel("requests")
            ax2 = ax.twinx()
            ax2.plot(t, [x.kv_usage for x in s], color="#2ca02c", lw=1, ls="--", label="KV usage")
            ax2.set_ylim(0, 1.05)
            ax2.set_ylabel("KV cache usage")
            ax2.grid(False)
            twins.append(ax2)
            ax.set_title(f"{c.label} at {c.knee_metrics.rate:.3g} req/s", fontsize=9)
        legend(fig, list(axes[0]) + twins)
        fig.suptitle("Queue depth and KV usage just above the knee")
        return svg(fig)


PLOTS = {"knee": knee_curves, "capacity": capacity_per_trial, "knobs": knob_trajectory,
         "latency_cdf": latency_cdfs, "timeseries": timeseries}


def twin_curves(rep: Report) -> str | None:
    """Each verified trial's knee curve as the twin predicted it (dashed) and as the launch measured it."""
    tw = rep.twin
    if tw is None or not tw.verified:
        return None
    with plt.rc_context(RC):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, v in enumerate(tw.verified):
            c = colors[i % len(colors)]
            for pts, style, lab in ((v.predicted_curve, "--", "predicted"), (v.measured_curve, "-", "measured")):
                pts = sorted((x, y) for x, y in pts if y is not None and math.isfinite(y))
                if pts:
                    ax.plot(*zip(*pts), style, color=c, marker="o", ms=3, lw=1.2,
                            label=f"trial {v.trial} {lab}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("SLO badness (1 = on the SLO)")
        legend(fig, [ax], ncol=2, where="outside right upper")
        return svg(fig)


PLOTS["twin"] = twin_curves


def knob_shares(rep: Report) -> str | None:
    """One bar a knob: its share of its step's gain (solid: measured, hatched: predicted by the twin),
    beside each step's measured total, the noise floor as a band around zero."""
    rows = [(s, r) for s in rep.attribution for r in s.rows]
    if not any(r.share_pct is not None for _, r in rows):  # nothing but n/a: the table says it, no chart
        return None
    with plt.rc_context(RC):
        labels, vals, styles = [], [], []
        for s in rep.attribution:
            if len(s.rows) > 1:
                labels.append(f"trial {s.trial}: all {len(s.rows)} knobs (measured total)")
                vals.append(s.gain_pct or 0.0)
                styles.append(("#2ca02c", None))
            for r in s.rows:
                labels.append(f"trial {s.trial}: {r.knob} ({r.source})")
                vals.append(r.share_pct if r.share_pct is not None else math.nan)
                styles.append(("#9ecae1", "//") if r.source == "predicted" else ("#1f77b4", None))
        fig, ax = plt.subplots(figsize=(6.4, 0.35 * len(labels) + 1.2))
        ys = list(range(len(labels)))[::-1]
        for y, v, (c, h) in zip(ys, vals, styles):
            ax.barh(y, v, color=c if h is None else "white", hatch=h, edgecolor=c, height=0.6)
        floor = 100 * (rep.recommendation.floor if rep.recommendation else rep.noise_floor)
        ax.axvspan(-floor, floor, color="#dddddd", alpha=0.5, lw=0, label=f"noise floor (±{floor:.0f}%)")
        ax.set_yticks(ys)
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("share of the step's capacity gain (% of the capacity before the step)")
        legend(fig, [ax])
        ax.set_title("Each knob's share (hatched: predicted by the fitted twin, not measured)", fontsize=9)
        return svg(fig)


PLOTS["shares"] = knob_shares


def all_plots(rep: Report) -> dict[str, str]:
    """Every chart of `rep` that has something to draw, by name. Drawn side by side (`tuner.twin.workers`:
    forked processes, on two cores two at a time): each is a second of matplotlib on its own, and they were
    the last serial stretch of the README's main job."""
    names = list(PLOTS)
    with Workers(lambda name: PLOTS[name](rep)) as workers:
        svgs = workers.map(names)
    return {name: text for name, text in zip(names, svgs) if text}
