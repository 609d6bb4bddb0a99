"""Name the resource that binds at the knee, with its evidence and the knobs that answer it.

Read from vLLM's own metrics just above the knee (the first failing rate: where the constraint shows)
and from the client's timings, following REFERENCE.md section 2:

| binds          | symptom                                                              |
|----------------|----------------------------------------------------------------------|
| kv_capacity    | KV usage near 1.0, preemptions, running below the batch cap          |
| batch_cap      | running at the batch cap, waiting > 0, KV usage < 0.9                |
| decode         | TPOT / ITL violated                                                  |
| prefill        | TTFT violated, mostly prefill time rather than queue time            |
| queue          | waiting climbs, batch not capped, KV has room, TTFT mostly queueing  |
| adapter_slots  | requests wait whose LoRA adapters do not run, every slot taken, batch and KV with room |

The knobs that answer each, in order and with their directions, are the knobs' own (`KnobSpec.answers`
in tuner/knobs.py; `tuner.knobs.answer_table()` prints the table), moved by the knobs' `place` hooks at
the knee's metrics (speculation first at a small batch and dropped at a large one; the token budget first
where ITL binds). The queue kind names no knob that adds capacity (that is more replicas, the capacity
plan); cheaper steps (quantisation, FP8 KV) answer it.

For decode, FP8 KV comes first, ahead of REFERENCE.md's order: every decode step reads the whole
resident KV cache, and FP8 halves those bytes with no trade-off, one launch to settle; the batch cap and
the token budget trade TPOT against queueing and TTFT and take several launches each. Measured on the
benchmark landscapes (benchmarks/search_efficiency.py), FP8 KV alone was worth +6% to +53% in each.
Quantization is listed last wherever it appears: it changes output quality and is only tried when the
search space allows it. Prefill is GEMM-compute-bound, which FP8 W8A8 (compute capability >= 8.9)
doubles, so it answers prefill too; a compute-saturated GPU also gains from FP8 KV, which halves the
attention bytes every step reads.
"""

from __future__ import annotations

from tuner.knobs import KNOB_SPECS, answering
from tuner.replay.record import TOOL_CAUSES
from tuner.storage.records import Diagnosis, LoadRunSummary, MetricsDigest

#: Which knobs answer each diagnosis, in order, and which way to turn each: from the knobs' own table.
KNOBS = {kind: answering(kind) for kind in ("kv_capacity", "batch_cap", "decode", "prefill", "queue",
                                            "adapter_slots")}


def diagnose(fail: LoadRunSummary | None, fail_metrics: MetricsDigest | None,
             passing: LoadRunSummary | None = None) -> Diagnosis:
    """The binding constraint just above the knee (`fail`), or at the highest rate measured."""
    point = fail or passing
    m = fail_metrics
    if point is None or m is None:
        return Diagnosis(kind="none", summary="no load run to read")
    mns = m.max_num_seqs
    batch_full = bool(mns) and m.running_p90 >= 0.95 * mns
    kv_full = m.kv_usage_p90 >= 0.9 or m.kv_usage_max >= 0.98
    preempting = m.preemptions > 0
    queueing = m.waiting_p90 >= 1 or m.waiting_mean >= 0.5
    climbing = m.waiting_trend >= 1.0  # the queue grows through the run: arrivals outpace service
    q, pf = m.queue_time_mean_s, m.prefill_time_mean_s
    queue_share = q / (q + pf) if q is not None and pf is not None and (q + pf) > 0 else None
    binding = point.binding
    ev: dict[str, float | str | None] = {
        "rate": round(point.rate, 3), "attainment": round(point.attainment, 4),
        "binding_slo_metric": binding, "running_p90": round(m.running_p90, 1),
        "max_num_seqs": mns, "waiting_p90": round(m.waiting_p90, 1),
        "kv_usage_p90": round(m.kv_usage_p90, 3), "preemptions": m.preemptions,
        "waiting_trend": round(m.waiting_trend, 1),
        "queue_share_of_ttft": None if queue_share is None else round(queue_share, 3),
        "p99_ttft_ms": _r(point.p99_ms.get("ttft")), "p99_tpot_ms": _r(point.p99_ms.get("tpot")),
        "prefix_hit_rate": None if m.prefix_hit_rate is None else round(m.prefix_hit_rate, 3),
    }
    if m.spec_acceptance_rate is not None:
        ev["spec_acceptance_rate"] = round(m.spec_acceptance_rate, 3)
        ev["spec_acceptance_length"] = round(m.spec_acceptance_length or 0.0, 3)

    errs = {k: v for k, v in point.errors_by_cause.items() if k not in TOOL_CAUSES}
    n_err = sum(errs.values())
    if point.n and (point.verdict == "errors" or n_err > max(sum(point.violations.values()), 0)
                    and n_err >= 0.01 * point.n):
        return _errors(point, errs, ev)
    slots = _adapter_slots(point, m, batch_full, kv_full and preempting, ev)
    if slots is not None:
        kind, why = "adapter_slots", slots
    elif kv_full and (preempting or not batch_full):
        kind = "kv_capacity"
        why = (f"KV cache {m.kv_usage_p90:.0%} full (p90) with {m.preemptions:.0f} preemptions while "
               f"{_running(m.running_p90, mns)} sequences run")
    elif batch_full and queueing:
        kind = "batch_cap"
        why = (f"running = max_num_seqs ({mns}) with {m.waiting_p90:.0f} waiting (p90) and KV only "
               f"{m.kv_usage_p90:.0%} full")
    elif binding in ("tpot", "itl"):
        kind = "decode"
        why = f"{binding.upper()} breaks the SLO first ({_broken(point, binding)})"
    elif climbing or (queue_share is not None and queue_share >= 0.5):
        kind = "queue"
        grows = (f"the queue grows through the run (waiting +{m.waiting_trend:.0f})" if climbing else
                 f"queueing is {queue_share:.0%} of TTFT")
        why = (f"{grows} while the batch ({_running(m.running_p90, mns)} running) and KV "
               f"({m.kv_usage_p90:.0%}) have room: the engine is compute-saturated; more replicas (the "
               "capacity plan) or a cheaper step help")
    elif binding == "ttft":
        kind = "prefill"
        share = "" if queue_share is None else f" (queueing {queue_share:.0%} of TTFT)"
        why = f"TTFT breaks the SLO first and is mostly prefill time, not queueing{share}"
    elif binding is None and point.verdict == "overloaded":
        kind = "queue"
        why = (f"the engine did not keep up: it served {point.served_rps or 0:.3g} of "
               f"{point.offered_rps or point.rate:.3g} req/s offered, with the batch "
               f"({_running(m.running_p90, mns)} running) and KV ({m.kv_usage_p90:.0%}) "
               "not the limit")
    else:
        kind = "decode"
        why = f"{(binding or 'latency').upper()} breaks the SLO first, mostly in generation, not queueing"
    knobs, directions = _placed(kind, binding, m)
    return Diagnosis(kind=kind, summary=why, evidence=ev, knobs=knobs, directions=dict(directions))


def why_none_with(why_none: str | None, diag: Diagnosis | None) -> str | None:
    """A "no rate met the SLO" line (`tuner.capacity.explain`, read from the requests that broke the
    bound) with what the engine's metrics say binds, where that is the adapter slots: the requests'
    own figures (long prompts, prefills ahead of them) are then waits for an adapter slot, and the
    request-level remedies (a faster GPU) would not change it; raising max_loras would."""
    if why_none is None or diag is None or diag.kind != "adapter_slots":
        return why_none
    seen = why_none.split("; would change it: ")[0]
    return f"{seen}; by vLLM's metrics, {diag.summary}"


def _adapter_slots(point: LoadRunSummary, m: MetricsDigest, batch_full: bool, kv_bound: bool,
                   ev: dict) -> str | None:
    """Adapter thrash: requests wait whose adapters do not run (vLLM's `waiting_lora_adapters` less the
    running ones) while every slot is taken and the batch and KV have room. Adds its evidence to `ev`.

    vLLM 0.32 names no adapter as only waiting (both labels list the adapters of scheduled requests:
    `tuner.metrics.parse`); there the sign is its deferred-waiting gauge, requests the scheduler skipped
    for the LoRA budget (`lora_deferred_mean`, at least one on average)."""
    if m.max_lora is None or m.lora_waiting_p90 is None:
        return None
    ev.update(waiting_lora_adapters_p90=round(m.lora_waiting_p90, 1),
              running_lora_adapters_p90=round(m.lora_running_p90 or 0.0, 1), max_lora=m.max_lora,
              adapter_loads=m.adapter_loads, adapter_disk_loads=m.adapter_disk_loads)
    deferred = m.lora_deferred_mean
    if deferred is not None:
        ev["requests_deferred_mean"] = round(deferred, 1)
    for group in ("hot", "cold"):
        ev[f"p99_ttft_ms_{group}_decile"] = _r((point.by_popularity.get(group) or {}).get("p99_ttft_ms"))
    waiting = m.lora_waiting_p90 >= 1 or (deferred or 0.0) >= 1
    if not waiting or (m.lora_running_p90 or 0) < m.max_lora or batch_full or kv_bound:
        return None
    hot, cold = ev["p99_ttft_ms_hot_decile"], ev["p99_ttft_ms_cold_decile"]
    split = f"; p99 TTFT {hot:.0f} ms hot decile, {cold:.0f} ms cold" if hot is not None and cold is not None else ""
    working = m.lora_waiting_p90 + (m.lora_running_p90 or 0.0)
    loads = ("" if m.adapter_loads is None else  # real vLLM 0.32 exports no load counts
             f"; {m.adapter_loads:.0f} adapter loads ({m.adapter_disk_loads or 0:.0f} from disk)")
    who = (f"{m.lora_waiting_p90:.0f} adapters waiting (p90)" if m.lora_waiting_p90 >= 1 else
           f"{deferred:.1f} requests deferred for the LoRA budget (mean)")
    return (f"requests wait for adapter slots: {who} while all "
            f"{m.max_lora} slots (max_loras) run, the batch ({_running(m.running_p90, m.max_num_seqs)}) and KV "
            f"({m.kv_usage_p90:.0%}) have room{loads}{split}. Raise max_loras (memory permitting), then max_cpu_loras; where no max_loras that "
            f"fits one replica holds the ~{working:.0f} adapters in flight, shard tenants across replica groups")


def _placed(kind: str, binding: str | None, m: MetricsDigest) -> tuple[list[str], dict[str, str]]:
    """The diagnosis's knobs in order, each knob's `place` hook applied at the knee's metrics: the knobs
    it puts first lead (in the table's order), the ones it drops are left out."""
    names, directions = KNOBS[kind]
    where = {n: (KNOB_SPECS[n].place(kind, binding, m) if KNOB_SPECS[n].place else None) for n in names}
    first = [n for n in KNOB_SPECS if where.get(n) == "first"]
    return first + [n for n in names if where[n] is None], directions


#: What each error cause says to do, for the one-line diagnosis of a run that fails on errors.
ERROR_ADVICE = {
    "over_context": "prompts exceed the model's context (max_model_len): raise it or pass --drop-overlong",
    "timeout": "requests timed out: the engine is far past saturation or stalled",
    "stalled": "streams stalled (no data for the stall timeout)",
    "truncated": "responses were shorter than asked for although EOS was ignored: the server caps lengths",
    "in_flight_cap": "requests hit the client's in-flight cap: far past saturation",
    "http_4xx": "the server refused requests (HTTP 4xx): check the model name, API key and request shape",
    "http_5xx": "the server failed requests (HTTP 5xx)",
    "connection": "connections dropped",
    "failed": "requests failed",
}


def _errors(point: LoadRunSummary, errs: dict[str, int], ev: dict) -> Diagnosis:
    """A run that fails on errors, not latency: the cause, counted, and what answers it."""
    cause, count = max(errs.items(), key=lambda kv: kv[1])
    ev = {**ev, "errors": point.errors, **{f"errors_{k}": v for k, v in errs.items()}}
    why = f"{count} of {point.n} {ERROR_ADVICE.get(cause, cause)}"
    if cause == "over_context":
        knobs, directions = answering(cause)
        return Diagnosis(kind="errors", summary=why, evidence=ev, knobs=knobs, directions=directions)
    return Diagnosis(kind="errors", summary=why, evidence=ev)


def _broken(point: LoadRunSummary, metric: str) -> str:
    """How many requests broke `metric`'s bound, counted as the SLO judges them (per request; ITL: each
    request's largest gap). Not the pooled p99: a pooled ITL p99 of 23 ms says nothing about the stalls
    that broke a 200 ms bound, and printed beside it reads as a contradiction."""
    k = point.violations.get(metric, 0)
    what = "with their largest inter-token gap over the bound" if metric == "itl" else "over the bound"
    return f"{k} of {point.n} requests {what}"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _running(running: float, max_num_seqs: int | None) -> str:
    """"30 of 256" when the batch cap is known, "30" when it is not (no "?" in a user's report)."""
    return f"{running:.0f} of {max_num_seqs}" if max_num_seqs else f"{running:.0f}"
