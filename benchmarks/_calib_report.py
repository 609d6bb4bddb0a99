"""The calibration set's report: per kind of figure, per GPU, the fitted part and the held-out part apart,
and a plot of every figure's residual (issue 61).

A figure's error is simulated / published - 1; "within 25%" is |error| <= 0.25. The held-out part is never
looked at by a fit (`calibration_set.held_out`), so its rows say how far the fit carries.
"""

from __future__ import annotations

import statistics
from pathlib import Path

PLOT = Path(__file__).resolve().parent / "results" / "calibration_residuals.png"
KIND_ORDER = ("throughput", "TPOT/ITL", "TTFT mean/median", "TTFT p99", "latency")
PARTS = ((False, "fitted"), (True, "held-out"))


def err(row) -> float:
    return row[5] / row[4] - 1


def stats(rows) -> tuple[int, float, float, float]:
    """(figures, share within 25%, share within 10%, median |error|)."""
    if not rows:
        return 0, float("nan"), float("nan"), float("nan")
    e = [abs(err(r)) for r in rows]
    return len(e), sum(x <= 0.25 for x in e) / len(e), sum(x <= 0.10 for x in e) / len(e), statistics.median(e)


def _kinds(rows) -> list[str]:
    return [k for k in KIND_ORDER if any(r[2] == k for r in rows)]


def text(rows, skipped) -> str:
    out = [f"{'held-out' if r[1] else 'fit':8s} {r[6]:10s} {r[0][:56]:56s} {r[3]:17s} pub {r[4]:10.2f} "
           f"sim {r[5]:10.2f} {err(r):+6.0%}" for r in rows]
    out.append("")
    for part, name in PARTS:
        sel = [r for r in rows if r[1] == part]
        n, w25, w10, med = stats(sel)
        out.append(f"{name} part: {n} figures: within 25% {w25:.0%}, within 10% {w10:.0%}, median |error| {med:.0%}")
        for kind in _kinds(sel):
            n, w25, w10, med = stats([r for r in sel if r[2] == kind])
            out.append(f"  {kind:18s} {n:3d} figures: within 25% {w25:.0%}, within 10% {w10:.0%}, "
                       f"median |error| {med:.0%}")
    out += [f"skipped {rid}: {why}" for rid, why in skipped]
    return "\n".join(out)


def _table(rows, key) -> list[str]:
    lines = ["| part | " + key + " | figures | within 25% | within 10% | median abs error | median signed error |",
             "|---|---|---:|---:|---:|---:|---:|"]
    groups = _kinds(rows) if key == "kind" else sorted({r[6] for r in rows})
    for part, name in PARTS:
        sel = [r for r in rows if r[1] == part]
        for g in groups:
            grp = [r for r in sel if (r[2] if key == "kind" else r[6]) == g]
            if not grp:
                continue
            n, w25, w10, med = stats(grp)
            signed = statistics.median(err(r) for r in grp)
            lines.append(f"| {name} | {g} | {n} | {w25:.0%} | {w10:.0%} | {med:.0%} | {signed:+.0%} |")
        n, w25, w10, med = stats(sel)
        lines.append(f"| {name} | **all** | {n} | **{w25:.0%}** | **{w10:.0%}** | {med:.0%} | |")
    return lines


def markdown(rows, skipped) -> str:
    runs = {r[0] for r in rows}
    out = [f"{len(rows)} figures of {len(runs)} runs re-simulated ({sum(not r[1] for r in rows)} in the fitted "
           f"part, {sum(r[1] for r in rows)} held out); {len(skipped)} runs skipped, each with its reason below.",
           "", "By kind of figure:", "", *_table(rows, "kind"), "", "By GPU:", "", *_table(rows, "gpu"), ""]
    p99 = [r for r in rows if r[3] == "p99_ttft_ms"]
    n, w25, _, _ = stats(p99)
    out += [f"TTFT p99 (both parts): {n} figures, {w25:.0%} within 25%.", ""]
    if plot(rows, PLOT):
        out += [f"![residuals per kind and GPU](../{PLOT.name})", ""]  # relative to the part file (results/sections/)
    out += ["<details><summary>Every figure</summary>", "", "| part | GPU | run | figure | published | simulated | error |",
            "|---|---|---|---|---:|---:|---:|"]
    out += [f"| {'held-out' if r[1] else 'fit'} | {r[6]} | {r[0]} | {r[3]} | {r[4]:.4g} | {r[5]:.4g} | {err(r):+.0%} |"
            for r in rows]
    out += ["", "</details>", "", "Skipped runs:", ""] + [f"- `{rid}`: {why}" for rid, why in skipped]
    return "\n".join(out)


def plot(rows, path: Path) -> bool:
    """Every figure's residual (log scale) by kind, coloured by GPU; hollow markers are held out. False
    where matplotlib is missing (the tables stand alone)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    kinds = _kinds(rows)
    gpus = sorted({r[6] for r in rows})
    colours = dict(zip(gpus, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=80)
    for i, kind in enumerate(kinds):
        for j, g in enumerate(gpus):
            for part in (False, True):
                sel = [r for r in rows if r[2] == kind and r[6] == g and r[1] == part]
                if not sel:
                    continue
                x = [i + (j - len(gpus) / 2) * 0.12 + (0.05 if part else 0) for _ in sel]
                y = [r[5] / r[4] for r in sel]
                ax.scatter(x, y, s=14, label=f"{g}{' (held out)' if part else ''}",
                           facecolors="none" if part else colours.get(g), edgecolors=colours.get(g))
    ax.set_yscale("log")
    ax.axhspan(0.75, 1.25, color="0.9", zorder=0)
    ax.axhline(1.0, color="0.4", lw=0.8)
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("simulated / published")
    ax.set_title("Calibration residuals (grey band: within 25%)")
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
