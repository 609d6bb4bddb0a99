"""`build_report(run_dir)`: the report as data, from the study storage alone.

No number in the report is computed anywhere else: the knee curves, diagnoses and metrics are the stored
trial records, so `tune report RUN_DIR` on a copied run directory reproduces the run's own report.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import yaml

from tuner import __version__
from tuner.engine.registry import engine_class
from tuner.errors import UserError
from tuner.knobs import KNOB_SPECS, Knobs
from tuner.plan import format_plan, plan_for_study
from tuner.profiles.models import hub_id
from tuner.report.model import (ConfigSummary, Headline, HeadlineRow, Report, TrialRow, WorkloadRef)
from tuner.lora.catalog import serve_args as lora_serve_args
from tuner.report.lora import lora_section
from tuner.report.quality import changing, floor_of, tuned_sentence
from tuner.report.time_use import time_use
from tuner.report.twin import twin_section
from tuner.recommend import (OUTPUT_KNOBS as QUALITY_KNOBS, Recommendation, Spread,  # noqa: F401
                             effective_floor, launch_spreads as _spreads, recommend_study,
                             recommended_record)
from tuner.storage.shares import SharesLog
from tuner.storage.select import (attribution, closest_run, knee_curve, pick_configs,
                                  saturation_throughput)
from tuner.storage.reader import StudyData, TrialView, load_study_data
from tuner.storage.quality import QualityResult
from tuner.storage.records import StudyInfo
from tuner.storage.status import study_status
from tuner.slo import SLO

def serve_args(knobs: dict) -> list[str]:
    return Knobs.stored(knobs).flags()


def hardware(info) -> str:
    """The hardware in words: the simulated GPU, or what the study recorded of a real engine's host."""
    if info.simulated or not info.host:
        return info.settings.engine.gpu or "this host"
    gpu = info.settings.engine.gpu
    return info.host + (f" (profile {gpu})" if gpu else "")


def serve_command(model: str | None, knobs: dict, extra_args: list[str] | tuple[str, ...] = (),
                  lora: list[str] | tuple[str, ...] = ()) -> str:
    """The tuned `vllm serve` command: the knobs' flags, then every other argument the measured launches
    used (`--vllm-arg`, e.g. `--enforce-eager`; LoRA's `--enable-lora --lora-modules ...`): a command
    without them is not what was measured."""
    return shlex.join(["vllm", "serve", model or "MODEL", *serve_args(knobs), *lora, *extra_args])


def config_yaml(model: str | None, knobs: dict, extra_args: list[str] | tuple[str, ...] = (),
                note: str = "", lora: list[str] | tuple[str, ...] = ()) -> str:
    """A vLLM `--config` file: keys are the flag names without dashes. A knob set to off is written as
    `no-<flag>: true`, which every vLLM version's config loader turns into `--no-<flag>`. The other
    server arguments the measured launches used follow the knobs (`--flag value` or a bare `--flag`)."""
    body: dict = {}
    for name, value in Knobs.stored(knobs).model_dump().items():
        if value is None:
            continue
        key = name.replace("_", "-")
        if isinstance(value, bool):
            body[key if value else f"no-{key}"] = True
        elif KNOB_SPECS[name].kind == "json":  # a mapping: vLLM's loader turns it back into the JSON flag
            body[key] = json.loads(value)
        else:
            body[key] = value
    if lora:  # LoRA on, with the adapters listed where the catalog has folders
        body["enable-lora"] = True
        modules = list(lora[lora.index("--lora-modules") + 1:]) if "--lora-modules" in lora else []
        if modules:
            body["lora-modules"] = modules
        else:
            note += "# LoRA adapters: add lora-modules: [name=path, ...] for the adapters the workload names.\n"
    body.update(_extra_args_config(extra_args))
    head = (f"# vLLM --config file for the recommended configuration, written by slo-tuner.\n"
            f"# Use: vllm serve {model or 'MODEL'} --config tuned-config.yaml\n" + note)
    if not body:
        return head + "# vLLM's defaults are recommended: nothing to set.\n{}\n"
    return head + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def _extra_args_config(args: list[str] | tuple[str, ...]) -> dict:
    """`--enforce-eager --kv-cache-memory-bytes 4194304` (or `--flag=value`) as config keys."""
    out: dict = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            i += 1
            continue
        key, eq, value = arg[2:].partition("=")
        if eq:
            out[key] = value
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = args[i + 1]
            i += 1
        else:
            out[key] = True
        i += 1
    return out


def _knee_trial(trials: list[TrialView], t: TrialView | None) -> TrialView | None:
    """The knee search of a paired trial's configuration (its load runs, diagnosis and latencies at its
    knee: the paired trial measured windows, not a knee), or the trial itself."""
    if t is None or t.record.role != "paired":
        return t
    return next((x for x in trials if x.state == "COMPLETE" and x.record.role != "paired"
                 and x.record.knobs == t.record.knobs), None)


def _summary(label: str, t: TrialView | None, trials: list[TrialView] = ()) -> ConfigSummary:
    """`t`'s capacity; where `t` is a paired trial, what only a knee search measures (the load runs, the
    diagnosis, the latencies at the knee) comes from the configuration's knee search, if it had one."""
    if t is None:
        return ConfigSummary(label=label)
    r = t.record
    k = _knee_trial(list(trials), t)
    kr = k.record if k is not None else None
    return ConfigSummary(label=label, trial=t.number, knobs=r.knobs, serve_args=serve_args(r.knobs),
                         capacity_rps=r.capacity_rps, capacity_upper_rps=r.capacity_upper_rps,
                         capacity_low_rps=r.capacity_low_rps, capacity_high_rps=r.capacity_high_rps,
                         no_capacity_reason=r.no_capacity_reason, kv_cache_tokens=r.kv_cache_tokens,
                         knee=knee_curve(kr.load_runs) if kr else [],
                         saturation_rps=saturation_throughput(kr.load_runs) if kr else None,
                         diagnosis=kr.diagnosis if kr else None, knee_metrics=kr.knee_metrics if kr else None,
                         latency_at_capacity=kr.latency_at_capacity if kr else None, quality=r.quality)


def _pct(b: float | None, t: float | None) -> float | None:
    return 100.0 * (t - b) / b if b not in (None, 0) and t is not None else None


MAX_RATE_GAP = 0.15  # a load run further than this from the comparison rate is not "the same offered load"


def _near(runs, rate):
    r = closest_run(runs, rate)
    return r if r is not None and rate and abs(r.rate / rate - 1) <= MAX_RATE_GAP else None


def headline(base: ConfigSummary, tuned: ConfigSummary) -> Headline:
    """Capacity and goodput at each config's capacity, then goodput, attainment and p99s of both configs
    at the baseline's capacity (the load run of each config closest to that rate, if within 15% of it),
    so the latencies are compared at the same offered load; and the p99s at each config's own capacity,
    which the search always measured."""
    rate = base.capacity_rps
    if rate is None:  # the baseline passed nowhere: compare at its lowest measured rate
        rate = min((r.rate for r in base.knee), default=None)
    b, t = _near(base.knee, rate), _near(tuned.knee, rate)
    bc, tc = closest_run(base.knee, base.capacity_rps), closest_run(tuned.knee, tuned.capacity_rps)
    rows = [HeadlineRow(metric="capacity within the SLO", unit="req/s", baseline=base.capacity_rps,
                        tuned=tuned.capacity_rps, change_pct=_pct(base.capacity_rps, tuned.capacity_rps),
                        better="higher", at="capacity")]

    def row(metric: str, unit: str, f, better: str, at: str) -> None:
        x, y = (b, t) if at == "same_rate" else (bc if base.capacity_rps else None,
                                                  tc if tuned.capacity_rps else None)
        bv, tv = (f(x) if x else None), (f(y) if y else None)
        rows.append(HeadlineRow(metric=metric, unit=unit, baseline=bv, tuned=tv, change_pct=_pct(bv, tv),
                                better=better, at=at))

    row("goodput", "req/s", lambda r: r.goodput, "higher", "capacity")
    row("goodput (vLLM bench: good / run duration)", "req/s", lambda r: r.goodput_bench, "higher",
        "capacity")
    row("goodput", "req/s", lambda r: r.goodput, "higher", "same_rate")
    row("attainment", "%", lambda r: 100.0 * r.attainment, "higher", "same_rate")
    for at in ("same_rate", "capacity"):
        for m in ("ttft", "tpot", "e2el"):
            row(f"p99 {m.upper()}", "ms", lambda r, m=m: r.p99_ms.get(m), "lower", at)
    tn = closest_run(tuned.knee, rate)
    return Headline(compare_rate_rps=rate, baseline_run_rate=b.rate if b else None,
                    tuned_run_rate=t.rate if t else None,
                    tuned_closest_rate=tn.rate if tn and t is None else None,
                    capacity_gain_pct=_pct(base.capacity_rps, tuned.capacity_rps), rows=rows)


def _trial_row(t: TrialView, chain: list[int] | None = None) -> TrialRow:
    """`incumbent` = the strategy stood on this trial: a candidate that beat the incumbent once but fell
    below it on its confirmation launch did not become one."""
    r = t.record
    return TrialRow(number=t.number, state=t.state, role=r.role, knobs=r.knobs, changed_knob=r.changed_knob,
                    launched=r.launched, launch_failure_kind=r.launch_failure_kind,
                    launch_failure_message=r.launch_failure_message, capacity_rps=r.capacity_rps,
                    capacity_upper_rps=r.capacity_upper_rps, incumbent_before=r.incumbent_before,
                    accepted=r.accepted, incumbent=None if chain is None else t.number in chain,
                    raced_out=r.raced_out,
                    load_runs=sum(x.repeats for x in r.load_runs), engine_s=r.engine_s, diagnosis=r.diagnosis,
                    quality=r.quality)


def _virtual(engine: str) -> bool:
    """Whether the engine's load runs ran in virtual time (its engine seconds are not wall seconds)."""
    try:
        return engine_class(engine).virtual_time
    except UserError:  # an outside engine this process has not registered: its seconds are taken as real
        return False


def launch_spreads(trials: list[TrialView]) -> list[Spread]:
    """Every configuration the study launched more than once (`tuner.recommend.launch_spreads`)."""
    return _spreads(t.record for t in trials)


def caveats(info: StudyInfo, tuned: ConfigSummary, base: ConfigSummary, counts: dict[str, int],
            gain_pct: float | None, status: str = "tuned", spreads: list[Spread] | None = None,
            rec: Recommendation | None = None, quality_floor: QualityResult | None = None) -> list[str]:
    """What the numbers do not say, in plain words, always in the report. `tuned` is the recommended
    configuration (`tuner.recommend`); `rec` says how it was chosen against the best measured one."""
    spreads, eng = spreads or [], info.settings.engine
    out = []
    if status == "no_launch":
        # nothing was measured: no hardware, quality or noise statement applies
        out.append("No configuration launched, so nothing was measured: the launch failures in the trial "
                   "table say why (a flag vLLM refused, memory, a crash). Fix that and run `tune` again.")
        if counts.get("RUNNING", 0) or counts.get("WAITING", 0):
            out.append("The study was interrupted: some trials never finished. `tune` resumes it.")
        return out
    if info.simulated:
        out.append(f"SIMULATED: every number here comes from slo-tuner's simulator of vLLM (engine "
                   f"`{eng.name}`, a roofline cost model calibrated to published vLLM measurements) "
                   f"for {eng.model} on {eng.gpu}, not from a real GPU. Treat them as predictions and "
                   + ("confirm with `tune gate gate.yaml --engine vllm` on the real hardware." if status == "tuned"
                      else "check them with `tune --engine vllm` on the real hardware."))
    else:
        out.append(f"Measured on real vLLM (engine `{eng.name}`) on {hardware(info)}.")
    if status == "tuned":  # else: no tuned configuration to say anything about
        out.append(tuned_sentence(changing(tuned.knobs), tuned.quality, quality_floor))
    configured = info.settings.noise_floor
    floor = effective_floor(configured, spreads)
    if rec is not None and rec.paired:
        out.append(f"Paired: the capacities compared are each configuration's geometric mean over the common "
                   f"request windows, with 95% intervals ({rec.test}); a change must clear the {configured:.0%} "
                   f"floor with the lower end of its gain's interval, under open-loop {info.settings.load.arrival} "
                   "arrivals of this workload.")
    else:
        out.append(f"Noise floor: capacities are bracketed to within {info.settings.knee.precision:.0%} and "
                   f"differences below "
                   f"{floor:.0%} are not meaningful; each capacity is the highest offered rate that "
                   f"kept attainment at the SLO target under open-loop {info.settings.load.arrival} arrivals of "
                   "this workload.")
    for sp in spreads:
        caps = " and ".join(f"{c:.3g}" for c in sp.capacities)
        out.append(f"Launch-to-launch spread: {sp.label} launched {len(sp.capacities)} times measured {caps} "
                   f"req/s ({sp.spread:.0%} apart)"
                   + (f", above the configured {configured:.0%} floor: the floor used is {floor:.0%}"
                      if sp.spread > configured else f", within the {configured:.0%} floor")
                   + "; the lower capacity stands.")
    for c in (base, tuned) if tuned.trial != base.trial else (base,):
        out += _config_caveats(c, paired=rec is not None and rec.paired)
    out += _recommendation_caveats(rec, gain_pct, floor)
    if tuned.capacity_rps is None:
        low = min((r.rate for r in tuned.knee), default=None)
        out.append("No configuration met the SLO at any offered rate"
                   + (f" (the lowest tried: {low:.3g} req/s)" if low else "")
                   + ": the SLO may be out of reach on this hardware; `tune plan` checks each threshold "
                     "against its single-stream floor (the prefill's for TTFT, the decode step's for TPOT).")
    elif tuned.trial is not None and tuned.trial == base.trial and (rec is None or rec.best_trial == base.trial):
        out.append("No configuration beat vLLM's defaults: the recommended configuration is the baseline.")
    skipped = counts.get("PRUNED", 0) + counts.get("FAIL", 0)
    if skipped:
        out.append(f"{counts.get('PRUNED', 0)} trial(s) were raced out or pruned and {counts.get('FAIL', 0)} "
                   f"failed (launch failures are classified in the trial table); they are part of the "
                   f"search, not of the comparison.")
    if counts.get("RUNNING", 0) or counts.get("WAITING", 0):
        out.append("The study was interrupted: some trials never finished. `tune` resumes it.")
    return out


def _config_caveats(c: ConfigSummary, *, paired: bool) -> list[str]:
    """A compared configuration's caveats: how certain its capacity is (its interval over the common
    windows when `paired`, else the bracket of its knee search), its failed requests by cause, and the
    load client's warnings."""
    out = []
    if c.capacity_rps and paired:
        out.append(f"{c.label.capitalize()}'s capacity {c.capacity_rps:.3g} req/s: 95% interval "
                   f"[{c.capacity_low_rps or 0:.3g}, {c.capacity_high_rps or 0:.3g}] over the common windows "
                   "(the spread of the request samples, not of one search's bracket).")
    elif c.capacity_rps:
        lo, hi = c.capacity_low_rps, c.capacity_high_rps
        out.append(f"{c.label.capitalize()}'s capacity {c.capacity_rps:.3g} req/s: "
                   + (f"it passed with its interval clear of the target at {lo:.3g} req/s"
                      if lo else "no load run passed with its interval clear of the target")
                   + (f" and failed clearly at {hi:.3g} req/s" if hi else ", and none failed clearly above it")
                   + " (the capacity's uncertainty from request sampling).")
    elif c.no_capacity_reason:
        out.append(f"{c.label.capitalize()}: {c.no_capacity_reason}.")
    causes: dict[str, int] = {}
    for p in c.knee:
        for k, v in p.errors_by_cause.items():
            causes[k] = causes.get(k, 0) + v
    if causes:
        out.append(f"{c.label.capitalize()}: failed requests by cause over its load runs: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(causes.items(), key=lambda kv: -kv[1]))
                   + "; failed, truncated and timed-out requests are never good.")
    warns = list(dict.fromkeys(w for p in c.knee for w in p.warnings))
    for w in warns[:5]:
        out.append(f"{c.label.capitalize()}, client warning: {w}")
    return out


def _recommendation_caveats(rec: Recommendation | None, gain_pct: float | None, floor: float) -> list[str]:
    """Why the recommendation is not the best measured configuration, when it is not."""
    if rec is None or rec.kind == "none":
        if gain_pct is not None and abs(gain_pct) < 100 * floor:
            return [f"The gain over vLLM's defaults ({gain_pct:+.1f}%) is within the noise floor: the "
                    "defaults are as good as anything found."]
        return []
    if rec.best_trial == rec.trial:
        return []
    if rec.paired:  # the paired check's words (`tuner.recommend.recommend_earned`): the why holds the figures
        what = "keep vLLM's defaults" if rec.kind == "defaults" else "recommend the smaller configuration"
        return [f"The search's best (trial {rec.best_trial}) against vLLM's defaults on the common windows: "
                f"{rec.why}; so the recommendation, `tuned-config.yaml` and `gate.yaml` {what}."]
    if rec.kind == "defaults":
        return [f"The best measured configuration (trial {rec.best_trial}) gained {rec.best_gain_pct:+.1f}% over "
                f"vLLM's defaults, within the {rec.floor:.0%} noise floor: not significant, so the "
                "recommendation, `tuned-config.yaml` and `gate.yaml` keep vLLM's defaults."]
    return [f"The best measured configuration (trial {rec.best_trial}, {rec.best_capacity_rps:.3g} req/s) is not "
            f"the recommended one (trial {rec.trial}, {rec.capacity_rps:.3g} req/s): {rec.why}; fewer knobs "
            "changed from vLLM's defaults are fewer things to carry, and no output-changing knob is "
            "recommended for a gain the noise can hide."]


def _storage_label(data: StudyData) -> str:
    url = data.storage_url
    db = (Path(data.run_dir) / "study.db").resolve()
    if url == f"sqlite:///{db}":
        return "study.db"
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def _compared(trials: list[TrialView], rec: Recommendation, base_t: TrialView | None, tuned_t: TrialView | None,
              best_t: TrialView | None) -> tuple[ConfigSummary, ConfigSummary, ConfigSummary]:
    """The baseline, recommended and best configurations as the report compares them: with the paired
    check, each at the capacity merged over its common windows (they may span two paired launches)."""
    forced = base_t.record.knobs if base_t is not None else {}
    base = _summary("baseline (vLLM defaults" + (f"; {', '.join(f'{k}={v}' for k, v in forced.items())} to fit "
                                                 "this host)" if forced else ")"), base_t, trials)
    tuned = _summary("keep vLLM's defaults" if rec.kind == "defaults" else "recommended", tuned_t, trials)
    best = _summary(("the search's best" if rec.paired else "best measured")
                    + ("" if rec.best_significant else ", not significant"), best_t, trials)
    if rec.paired:
        if rec.defaults_capacity_rps is not None:
            base = base.model_copy(update={"capacity_rps": rec.defaults_capacity_rps,
                                           "capacity_low_rps": rec.defaults_low_rps,
                                           "capacity_high_rps": rec.defaults_high_rps})
        if rec.capacity_rps is not None:
            tuned = tuned.model_copy(update={"capacity_rps": rec.capacity_rps,
                                             "capacity_low_rps": rec.capacity_low_rps,
                                             "capacity_high_rps": rec.capacity_high_rps})
        if rec.best_capacity_rps is not None and best_t is not None and best_t.number == rec.best_trial:
            best = best.model_copy(update={"capacity_rps": rec.best_capacity_rps})
    return base, tuned, best


def _tuned_command(info: StudyInfo, tuned: ConfigSummary, rec: Recommendation) -> tuple[str, str]:
    """The recommended configuration's `vllm serve` command and `--config` file, with every other
    argument the measured launches used (the LoRA adapters, `--vllm-arg`)."""
    eng = info.settings.engine
    lora = lora_serve_args(eng.lora_dir)
    served = hub_id(eng.model) if info.simulated and eng.model else eng.model  # what vLLM loads
    serve = serve_command(served, tuned.knobs, eng.extra_args, lora)
    cfg = config_yaml(served, tuned.knobs, eng.extra_args,
                      note=f"# Keep vLLM's defaults: {rec.why}.\n" if rec.kind == "defaults" else "", lora=lora)
    return serve, cfg


def build_report(run_dir: str | Path) -> Report:
    """The report of the study in `run_dir` (see `tuner.storage.reader` for the layout)."""
    data = load_study_data(run_dir)
    info, eng = data.info, data.info.settings.engine
    if not data.trials:
        raise UserError("the study has no trials yet", file=run_dir)
    base_t, best_t = pick_configs(data.trials, data.outcome)
    status, status_text = study_status(t.record for t in data.trials
                                       if t.state not in ("RUNNING", "WAITING"))
    rec = recommend_study(data)  # the one decision the headline, the config file and the gate all show
    by_number = {t.number: t for t in data.trials}
    if rec.paired and rec.defaults_trial in by_number:
        base_t = by_number[rec.defaults_trial]  # compared on the same windows as what is recommended
        best_t = by_number.get(rec.best_trial, best_t) if rec.best_trial is not None else best_t
    tuned_t = by_number.get(rec.trial) if rec.kind != "none" else None
    if status != "tuned":
        best_t = None  # nothing is "best": no configuration met the SLO (or none launched)
    base, tuned, best = _compared(data.trials, rec, base_t, tuned_t, best_t)
    # the headline compares the defaults with what is recommended, or, when that is the defaults, with
    # the best measured configuration (labelled as not significant)
    shown = best if tuned_t is not None and tuned_t is base_t and best_t is not None else tuned
    head = headline(base, shown)
    head.tuned_label = shown.label + (f" (trial {shown.trial})" if shown.trial is not None else "")
    counts: dict[str, int] = {}
    for t in data.trials:
        counts[t.state] = counts.get(t.state, 0) + 1
    slo = SLO.model_validate(info.slo)
    plan = plan_text = None
    if slo.peak_rate and tuned.capacity_rps:
        try:
            plan = plan_for_study(info, recommended_record(data, rec) if tuned_t else None, where=str(run_dir))
            plan_text = format_plan(plan)
        except UserError as e:
            plan_text = f"no capacity plan: {e.format()}"
    title = (f"{'SIMULATED: ' if info.simulated else ''}vLLM tuning report: {eng.model or 'model'} on "
             f"{hardware(info)}, workload {Path(str(info.settings.workload)).name}"
             + {"no_launch": ": NO RESULT (no configuration launched)",
                "no_pass": ": NO RESULT (no configuration met the SLO)"}.get(status, ""))
    serve, cfg = _tuned_command(info, tuned, rec) if status == "tuned" else (
        "", f"# No tuned configuration: {status_text}\n")
    gate = Path(run_dir) / "gate.yaml"

    return Report(
        generated_unix=time.time(), tool_version=info.tool_version or __version__, title=title,
        simulated=info.simulated, engine=eng.name, gpu=eng.gpu, model=eng.model,
        hardware=hardware(info),
        study_name=data.study_name, storage=_storage_label(data), strategy=info.settings.search.strategy,
        arrival=info.settings.load.arrival, noise_floor=info.settings.noise_floor,
        precision=info.settings.knee.precision,
        workload=WorkloadRef(path=str(info.settings.workload), sha256=info.workload_sha256,
                             requests=info.workload_requests,
                             mean_prompt_tokens=info.workload_mean_prompt_tokens,
                             mean_output_tokens=info.workload_mean_output_tokens,
                             token_count=info.workload_token_count),
        slo_path=str(info.settings.slo), slo_sha256=info.slo_sha256, slo=info.slo, slo_text=slo.describe(),
        baseline=base, tuned=tuned, best=best, recommendation=rec, headline=head,
        attribution=attribution(data.trials, base_t, best_t, info.vllm_defaults, data.outcome, data.shares,
                                floor=rec.floor),
        trials=[_trial_row(t, (data.outcome or {}).get("incumbent_chain")) for t in data.trials],
        counts=counts,
        engine_s=sum(t.record.engine_s for t in data.trials),
        serve_command=serve, config_yaml=cfg, plan=plan, plan_text=plan_text,
        caveats=caveats(info, tuned, base, counts, head.capacity_gain_pct, status, launch_spreads(data.trials),
                        rec, floor_of(t.record.quality for t in data.trials)),
        quality_text=tuned_sentence(changing(tuned.knobs), tuned.quality,
                                    floor_of(t.record.quality for t in data.trials)) if status == "tuned" else None,
        status=status, status_text=status_text, gate_written=gate.exists(),
        learned=[f"{c.text()}: {' '.join(c.message.split())[:240]}"
                 for t in sorted(data.trials, key=lambda t: t.number) for c in t.record.learned],
        time_use=time_use(data.trials, virtual=_virtual(eng.name)), lora=lora_section(data.trials),
        twin=twin_section(data), simplification=SharesLog.read({"shares": data.shares}).simplification
        if data.shares else None)
