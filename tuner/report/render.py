"""Render a `Report` as Markdown and as one self-contained HTML file.

Both come from the same list of blocks (heading, paragraph, table, code, list, figure), so the two can
never disagree. The HTML inlines its CSS and embeds each chart as a `data:` URI: opened from disk, from a
CI artifact or from an e-mail, it requests nothing from anywhere.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from tuner.report.model import Report
from tuner.report.lora import lora_rows
from tuner.report.quality import cell as quality_cell, section_rows as quality_rows
from tuner.report.time_use import set_use_rows, time_use_rows
from tuner.storage.select import fmt_value

FIGURES = [("knee", "Knee curves of the baseline and the tuned configuration"),
           ("capacity", "Capacity per trial"),
           ("knobs", "Knob trajectory"),
           ("latency_cdf", "Latency CDFs at capacity"),
           ("timeseries", "Queue depth and KV usage over time")]


@dataclass
class Block:
    kind: str                     # h1 | h2 | p | table | code | ul | fig | note
    text: str = ""
    rows: list[list[str]] = field(default_factory=list)
    lang: str = ""


def _n(v, digits: int = 3) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"
    return str(v)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def _knobs(k: dict) -> str:
    return ", ".join(f"{n}={fmt_value(v)}" for n, v in k.items()) or "vLLM defaults"


def _recommendation(rep: Report) -> list[Block]:
    """The answer first, in the words the CLI prints (`tuner.recommend.Recommendation.line`)."""
    rec = rep.recommendation
    if rec is None or rec.kind == "none":
        return []
    out = [Block("h2", "Recommendation"), Block("note", rec.line()[0].upper() + rec.line()[1:])]
    best = rec.best_line()
    if best:
        out.append(Block("p", best[0].upper() + best[1:] + "."))
    if rec.kind == "defaults":
        out.append(Block("p", "`tuned-config.yaml` sets nothing and `gate.yaml` holds vLLM's defaults to their "
                              "measured capacity."))
    return out + _paired(rec)


def _paired(rec) -> list[Block]:
    """The paired evidence the recommendation rests on (`tuner.search.earn`): the test, each knob's
    measured share with its interval, and the ties."""
    if not rec.paired:
        return []
    text = (f"Decided on common request windows: every configuration named here was measured on the same "
            f"requests, arrivals and rates ({rec.test}); its capacity is the geometric mean over the windows "
            f"of each window's highest passing rate, with its 95% interval. A change is recommended only when "
            f"the lower end of its paired gain's 95% interval over vLLM's defaults clears the {rec.floor:.0%} "
            f"floor; a knob stays only when the configuration without it measures significantly less (an "
            f"output-changing knob: by at least the floor, at the lower end of its interval).")
    if rec.baseline_line():
        text += f" Measured so: {rec.baseline_line()}."
    out = [Block("p", text)]
    if rec.shares:
        rows = [["knob", "share (measured, paired)", "95% interval", "windows", "trials (with / without)",
                 "in the recommendation"]]
        for s in rec.shares:
            rows.append([s.knob, _pct(s.share_pct), f"[{_pct(s.low_pct)}, {_pct(s.high_pct)}]"
                         if s.low_pct is not None else "n/a", str(s.windows),
                         f"{s.with_trial} / {s.without_trial if s.without_trial is not None else '-'}",
                         "yes" if s.kept else "no (no significant share)"])
        out.append(Block("table", rows=rows))
    if rec.ties:
        out.append(Block("p", "Tied with the recommendation (no significant difference, more knobs): "
                              + "; ".join(rec.ties) + "."))
    return out


def _headline(rep: Report) -> list[Block]:
    h = rep.headline
    rows = [["", rep.baseline.label, h.tuned_label, "change"]]
    for r in h.rows:
        if r.metric.startswith("capacity"):
            name = r.metric
        elif r.at == "capacity":
            name = f"{r.metric} at its own capacity"
        else:
            name = f"{r.metric} at ~{_n(h.compare_rate_rps)} req/s"
        rows.append([f"{name} ({r.unit})", _n(r.baseline), _n(r.tuned), _pct(r.change_pct)])
    where = ("the baseline's capacity" if rep.baseline.capacity_rps is not None else
             "the baseline's lowest measured rate (it met the SLO nowhere)")
    how = ("the paired capacity on the common windows (above); the other rows come from each configuration's "
           "knee search, where it had one" if rep.recommendation is not None and rep.recommendation.paired
           else "each configuration's highest passing offered rate")
    note = (f"Capacity is {how}. The \"at ~{_n(h.compare_rate_rps)} "
            f"req/s\" rows compare both at the same offered load, {where}, using each configuration's load "
            f"run closest to it")
    if h.tuned_closest_rate is not None:
        other = h.tuned_label.split(" (")[0].split(",")[0]  # "recommended" or "best measured"
        note += (f"; the search never measured the {other} configuration near that rate (closest: "
                 f"{_n(h.tuned_closest_rate)} req/s), so its same-rate cells are empty: compare the "
                 f"at-capacity rows, where each configuration carries its own (higher) load")
    else:
        note += f" ({_n(h.baseline_run_rate)} req/s for the baseline, {_n(h.tuned_run_rate)} req/s for the other)"
    return [Block("h2", "Headline"), Block("table", rows=rows), Block("p", note + ".")]


def _share(r) -> str:
    if r.share_pct is None:
        return "n/a (not predicted)"
    out = f"{r.share_pct:+.1f}% ({r.source})"
    if r.source == "measured" and r.predicted_share_pct is not None:
        out += f"; predicted {r.predicted_share_pct:+.1f}%"
    return out


def _attribution(rep: Report, figures: set[str] = frozenset()) -> list[Block]:
    out = [Block("h2", "Where the gain came from, knob by knob")]
    if not rep.attribution:
        out.append(Block("p", "No trial beat the baseline: nothing to attribute."))
        return out
    knobs_of = {t.number: t.knobs for t in rep.trials}
    paired = rep.recommendation is not None and rep.recommendation.paired
    rows = [["trial", "knob", "change", "share of the gain", "step total (measured, req/s)",
             "in the recommendation", "why this knob (diagnosis)"]]
    for s in rep.attribution:
        total = f"{_n(s.before_rps)} -> {_n(s.after_rps)} ({_pct(s.gain_pct)})"
        for i, r in enumerate(s.rows):
            value = knobs_of.get(s.trial, {}).get(r.knob)  # None: the step set it back to vLLM's default
            kept = "yes" if rep.tuned.knobs.get(r.knob) == value else "no"
            if kept == "no" and r.within_noise:
                kept = "no (within noise)"
            elif kept == "yes" and r.source != "measured" and not paired:
                kept = "yes (not measured alone)"
            rows.append([str(s.trial), r.knob, r.change, _share(r),
                         total if i == 0 else f"(trial {s.trial}, same step)", kept, s.why or ""])
    multi = any(len(s.rows) > 1 for s in rep.attribution)
    text = ("Each accepted trial became the new incumbent; its gain is measured against the incumbent it "
            "replaced, so the steps add up to the total gain.")
    if multi:
        text += (" A step that changed several knobs at once gets each knob's share predicted by the fitted "
                 "twin: the step's configuration with that knob left as before, predicted, against the step "
                 "predicted whole. Those shares are labelled predicted: they were not measured (`--attribute` "
                 "measures them with one launch each); knobs that interact need not add up to the step's "
                 "measured total.")
        text += (" Predicted shares decide nothing: which knobs the recommendation keeps is measured, paired "
                 "(the table under Recommendation)." if paired else
                 " Without the paired check (`--windows`, off on real-time engines) no knob of a multi-knob "
                 "step was measured alone: the recommendation is a configuration measured as a whole, and a "
                 "knob marked \"not measured alone\" rides with it unproven (`--attribute` or `--windows N` "
                 "measures each).")
    out += [Block("table", rows=rows), Block("p", text)]
    if rep.simplification is not None and rep.simplification.note:
        out.append(Block("p", rep.simplification.note))
    if "shares" in figures:
        out.append(Block("fig", "Each knob's share of the gain (hatched: predicted)", lang="shares"))
    elif not any(r.share_pct is not None for s in rep.attribution for r in s.rows):
        out.append(Block("p", "No chart of the shares: every knob's share above is n/a (no step's knobs were "
                              "measured one at a time and no fitted twin predicted them; `--attribute` measures "
                              "each with one launch)."))
    return out


def _config(rep: Report) -> list[Block]:
    what = ("vLLM's defaults: nothing to set" if rep.recommendation and rep.recommendation.kind == "defaults"
            else _knobs(rep.tuned.knobs))
    return [Block("h2", "The recommended configuration"),
            Block("p", f"Trial {rep.tuned.trial}: {what}."),
            Block("code", rep.serve_command, lang="sh"),
            Block("p", "The same as a vLLM `--config` file (`tuned-config.yaml`, beside this report):"),
            Block("code", rep.config_yaml.rstrip("\n"), lang="yaml")]


def _quality(rep: Report) -> list[Block]:
    """The recommended configuration's output quality beside its capacity, and every checked launch."""
    rows = quality_rows(rep.trials, bounded=bool((rep.slo or {}).get("quality")))
    if rep.quality_text is None and len(rows) == 1:
        return []
    out = [Block("h2", "Output quality against vLLM's defaults")]
    if rep.quality_text:
        out.append(Block("p", rep.quality_text))
    if len(rows) > 1:
        out.append(Block("table", rows=rows))
    return out


def _trials(rep: Report) -> list[Block]:
    rows = [["#", "state", "knobs", "capacity (req/s)", "outcome", "quality", "diagnosis", "evidence"]]
    launches = Counter(json.dumps(t.knobs, sort_keys=True) for t in rep.trials if t.launched)
    for t in rep.trials:
        twice = launches[json.dumps(t.knobs, sort_keys=True)] > 1
        if t.launch_failure_kind == "ruled_out":
            outcome = f"not launched: {(t.launch_failure_message or '')[:160]}"
        elif t.launch_failure_kind in ("requests_failed", "client_bound"):
            outcome = f"launched; {(t.launch_failure_message or '')[:200]}"
        elif not t.launched and t.launch_failure_kind:
            outcome = f"launch failed ({t.launch_failure_kind}): {(t.launch_failure_message or '')[:160]}"
        elif t.role == "simplify" and t.state == "COMPLETE":
            outcome = "the best less the knobs whose share was within noise, launched to confirm it"
        elif t.role == "attribute" and t.state == "COMPLETE":
            outcome = f"--attribute: its step without {t.changed_knob}, launched to measure that knob's share"
        elif t.quality is not None and t.quality.rejected:
            outcome = f"rejected for output quality: {t.quality.rejected} (the SLO's quality bound)"
        elif t.raced_out:
            at = t.capacity_upper_rps or t.incumbent_before
            outcome = (f"raced out: failed its one load run at {_n(at)} req/s (incumbent: "
                       f"{_n(t.incumbent_before)} req/s)")
        elif t.incumbent:
            outcome = "incumbent (the baseline)" if not t.knobs else "accepted (new incumbent)"
        elif t.incumbent is False and t.role in ("baseline", "confirm") and t.state == "COMPLETE" and twice:
            outcome = "launched twice: the lower (or equal) other launch of the pair stands"
        elif t.incumbent is False and t.role == "baseline" and t.state == "COMPLETE" and not t.capacity_rps:
            outcome = "the baseline met the SLO at no rate: no incumbent to stand on"
        elif t.incumbent is False and t.accepted and t.state == "COMPLETE" and twice:
            outcome = "beat the incumbent once; not kept after its second launch"
        elif t.incumbent is False and t.accepted and t.state == "COMPLETE":
            outcome = "beat the incumbent when launched; not on the search's final chain of incumbents"
        elif t.accepted and t.incumbent is None:
            outcome = "accepted (new incumbent)"
        elif t.state == "COMPLETE":
            outcome = "rejected (not better)"
        else:
            outcome = t.state.lower()
        d = t.diagnosis
        ev = ", ".join(f"{k}={_n(v)}" for k, v in (d.evidence if d else {}).items() if v is not None)
        if d is None:
            diag = ""
        elif d.kind == "launch_failure":  # the message is already in the outcome column
            diag = "launch failure: next try " + ", ".join(f"{k} {d.directions.get(k, '')}".strip()
                                                          for k in d.knobs) if d.knobs else "launch failure"
        else:
            diag = f"{d.kind}: {d.summary}"
        cap = _n(t.capacity_rps) + (f" (< {_n(t.capacity_upper_rps)})" if t.capacity_upper_rps else "")
        rows.append([str(t.number), t.role if t.role == "baseline" else t.state.lower(), _knobs(t.knobs),
                     cap, outcome, quality_cell(t.quality), diag, ev])
    out = [Block("h2", "Every trial, with its diagnosis and evidence"), Block("table", rows=rows)]
    if rep.learned:
        out += [Block("h2", "What failed launches taught"),
                Block("p", "Each of these ruled values out for the rest of the study (no later trial was "
                           "launched with them; a resumed study reads them back from storage):"),
                Block("ul", rows=[[x] for x in rep.learned])]
    return out


def _twin(rep: Report, figures: set[str]) -> list[Block]:
    tw = rep.twin
    if tw is None:
        return []
    out = [Block("h2", "The twin: predicted against measured"),
           Block("p", f"The simulator was fitted to this engine's own launches ({len(tw.fits)} fits) and "
                      f"predicted all {tw.configurations} configurations of the space"
                      + (f" ({tw.raced_out} of them only as below a better one's capacity: their quick screen "
                         f"failed clearly there, so no knee was searched)" if tw.raced_out else "")
                      + "; launches only verified its best. Each prediction below was stored before its launch."
                      + (f" Median prediction error on verified trials: {tw.median_abs_error:.1%}"
                         + (f" ({tw.median_abs_anchored_error:.1%} anchored: the incumbent's measured "
                            f"capacity times the twin's predicted ratio, the number the search acted on)"
                            if tw.median_abs_anchored_error is not None else "") + "."
                         if tw.median_abs_error is not None else "")
                      + (f" Stopped: {tw.stop_reason}." if tw.stop_reason else ""))]
    rows = [["trial", "knobs", "predicted (req/s)", "anchored (req/s)", "measured (req/s)", "error (anchored)"]]
    for v in tw.verified:
        meas = "raced out" if v.raced_out else _n(v.measured_rps)
        err = "n/a" if v.error is None else f"{v.error:+.1%}"
        if v.anchored_error is not None:
            err += f" ({v.anchored_error:+.1%})"
        rows.append([str(v.trial), _knobs(v.knobs), _n(v.predicted_rps), _n(v.anchored_rps), meas, err])
    if len(rows) > 1:
        out.append(Block("table", rows=rows))
    if "twin" in figures:
        out.append(Block("fig", "Predicted (dashed) and measured knee curves of the verified trials", lang="twin"))
    rows = [["rank", "knobs", "predicted (req/s)", "binds (twin)", "measured (req/s)"]]
    for i, r in enumerate(tw.ranking, 1):
        meas = "not launched" if r.launched_trial is None else (
            f"{_n(r.measured_rps)} (trial {r.launched_trial})" if r.measured_rps else f"trial {r.launched_trial}: no capacity")
        rows.append([str(i), _knobs(r.knobs), _n(r.predicted_rps), r.binding or "", meas])
    out += [Block("h2", "The twin's ranking of the whole space (top ten, latest fit)"), Block("table", rows=rows)]
    if tw.fits:
        rows = [["after trial", "fitted to", "loss (nominal)", "fitted parameters", "residuals (median |sim/measured - 1|)"]]
        for f in tw.fits:
            params = ", ".join(f"{k}={_n(v)}" for k, v in f.params.items())
            res = ", ".join(f"{k} {v:.0%}" for k, v in f.residuals.items())
            rows.append([str(f.after_trial), ", ".join(map(str, f.trials)), f"{f.loss:.3g} ({f.nominal_loss:.3g})",
                         params, res])
        out += [Block("h2", "Twin fits"), Block("table", rows=rows)]
    return out


def blocks(rep: Report, figures: set[str]) -> list[Block]:
    c = rep.counts
    w = rep.workload
    out = [Block("h1", rep.title)]
    if rep.simulated:
        out.append(Block("note", "SIMULATED: these numbers were measured on slo-tuner's vLLM simulator, not on "
                                 "a GPU. See the caveats."))
    out.append(Block("p", f"Model `{rep.model}` on {rep.hardware or rep.gpu or 'this host'}, engine `{rep.engine}`. Workload `{w.path}` "
                          f"({w.requests} requests, mean {w.mean_prompt_tokens:.0f} prompt / "
                          f"{w.mean_output_tokens:.0f} output tokens, {rep.arrival} arrivals"
                          + (f"; {w.token_count}" if w.token_count else "") + "). SLO: "
                          f"{rep.slo_text} (`{rep.slo_path}`). {len(rep.trials)} trials: "
                          + ", ".join(f"{v} {k.lower()}" for k, v in sorted(c.items())) + "."))
    if rep.status != "tuned":
        out += _no_result(rep)
    else:
        out += _recommendation(rep) + _headline(rep) + _quality(rep) + _attribution(rep, figures) + _config(rep)
    if rep.plan_text:
        out += [Block("h2", "Capacity plan"), Block("code", rep.plan_text, lang="text")]
    out += [Block("h2", "Caveats"), Block("ul", rows=[[x] for x in rep.caveats])]
    out.append(Block("h2", "Charts"))
    for name, caption in FIGURES:
        if name in figures:
            out.append(Block("fig", caption, lang=name))
    out += _twin(rep, figures)
    if rep.lora is not None:
        out += [Block("h2", "LoRA adapters: the hot and the cold tenants"),
                Block("p", "Each trial at its capacity (its highest passing rate; its lowest rate where none "
                           "passed): p99 TTFT and attainment of the requests of the most requested tenth of the "
                           "adapters and of the least requested tenth (the workload's own counts; the cold "
                           "decile has few requests, so its p99 is close to its maximum)."),
                Block("table", rows=lora_rows(rep.lora))]
    out += _trials(rep)
    if rep.time_use is not None:
        out += [Block("h2", "Where the study's time went"), Block("table", rows=time_use_rows(rep.time_use))]
        if rep.time_use.sets:
            out += [Block("p", "Trials ran side by side, one at a time on each device set:"),
                    Block("table", rows=set_use_rows(rep.time_use))]
    if rep.status != "tuned" or rep.gate_written is False:
        out += [Block("h2", "Reproduce"),
                Block("p", "Everything above is rebuilt from the study storage alone. No regression gate "
                           "was written: there is no measured capacity to hold a configuration to."),
                Block("code", "tune report RUN_DIR", lang="sh")]
        return out
    out += [Block("h2", "Reproduce"),
            Block("p", "Everything above is rebuilt from the study storage alone, and the regression gate "
                       "re-measures the recommended configuration:"),
            Block("code", "tune report RUN_DIR\ntune gate RUN_DIR/gate.yaml", lang="sh")]
    return out


def _no_result(rep: Report) -> list[Block]:
    """A study without a result says so first, and presents nothing as the best configuration."""
    what = {"no_launch": "no configuration launched", "no_pass": "no configuration met the SLO"}[rep.status]
    return [Block("h2", f"No result: {what}"),
            Block("note", f"NO RESULT: {(rep.status_text or '').rstrip('.')}."),
            Block("p", "There is no tuned configuration, no gain over vLLM's defaults and no regression gate. "
                       "The trial table below shows what each trial did.")]


# --- Markdown -------------------------------------------------------------------------------------------


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def to_markdown(rep: Report, figures: set[str]) -> str:
    return page_markdown(blocks(rep, figures))


def page_markdown(page: list[Block], fig_src: str = "plots/{}.svg") -> str:
    """Blocks as Markdown (the report, the fleet verification); a figure's file is `fig_src` of its name."""
    lines: list[str] = []
    for b in page:
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "note":
            lines += [f"> **{b.text}**", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "table":
            head, *body = b.rows
            lines.append("| " + " | ".join(_md_cell(x) for x in head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(_md_cell(x) for x in r) + " |" for r in body]
            lines.append("")
        elif b.kind == "code":
            lines += [f"```{b.lang}", b.text, "```", ""]
        elif b.kind == "ul":
            lines += [f"- {r[0]}" for r in b.rows] + [""]
        elif b.kind == "fig":
            lines += [f"![{b.text}]({fig_src.format(b.lang)})", ""]
    return "\n".join(lines)


# --- HTML -----------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
td,th{border:1px solid #ddd;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f4f4f4}tr:nth-child(even) td{background:#fafafa}
pre{background:#f6f8fa;padding:.7em;font-size:.85em;white-space:pre-wrap;overflow-wrap:anywhere}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
.note{background:#fff3cd;border:1px solid #e0c060;padding:.6em .9em;font-weight:600}
figure{margin:1em 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.88em}
"""


def _inline(s: str) -> str:
    """Escape, then turn `code` spans into <code> (the only inline markup the blocks use)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(s, quote=False))


def to_html(rep: Report, svgs: dict[str, str]) -> str:
    return page_html(rep.title, blocks(rep, set(svgs)), svgs)


def page_html(title: str, page: list[Block], svgs: dict[str, str]) -> str:
    """Blocks as one self-contained HTML page in the report's style, each figure's SVG inlined."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<style>{CSS}</style></head><body>"]
    for b in page:
        if b.kind in ("h1", "h2"):
            parts.append(f"<{b.kind}>{_inline(b.text)}</{b.kind}>")
        elif b.kind == "note":
            parts.append(f'<p class="note">{_inline(b.text)}</p>')
        elif b.kind == "p":
            parts.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "table":
            head, *body = b.rows
            parts.append("<table><thead><tr>" + "".join(f"<th>{_inline(x)}</th>" for x in head)
                         + "</tr></thead><tbody>")
            parts += ["<tr>" + "".join(f"<td>{_inline(x)}</td>" for x in r) + "</tr>" for r in body]
            parts.append("</tbody></table>")
        elif b.kind == "code":
            parts.append(f"<pre><code>{html.escape(b.text, quote=False)}</code></pre>")
        elif b.kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{_inline(r[0])}</li>" for r in b.rows) + "</ul>")
        elif b.kind == "fig":
            data = base64.b64encode(svgs[b.lang].encode("utf-8")).decode("ascii")
            parts.append(f'<figure id="fig-{b.lang}"><img alt="{html.escape(b.text)}" '
                         f'src="data:image/svg+xml;base64,{data}"><figcaption>{html.escape(b.text)}'
                         f"</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
