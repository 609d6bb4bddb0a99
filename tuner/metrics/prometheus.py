"""The same `MetricsWindow`, read from a Prometheus server that already scrapes the vLLM fleet.

In production the tuner may not reach `/metrics` itself (only the monitoring stack does), or the operator
wants the numbers their dashboards show. So a load run's window can also be asked of Prometheus:

- gauges as range queries over the window (`step` = the sample interval), reduced across label sets
  like the direct scrape (sum; average for KV usage);
- counters and histogram buckets as `increase(...[window])` evaluated at the window's end. Prometheus
  extrapolates `increase` to the window edges, so values are not integers and may differ from the
  scrape-delta numbers by a scrape interval's worth; they explain a run, they do not score it;
- old and new vLLM names through PromQL `or` (the new name wins when both exist).

Times: Prometheus works in Unix seconds; sample `t` is seconds since `t0_unix` (the run's
`started_unix`), divided by the run's time scale like every other time of a run.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from tuner.errors import UserError
from tuner.metrics.parse import (E2EL, ITERATION_TOKENS, ITL, KV_USAGE, QUEUE_TIME, RENAMED, RUNNING, TTFT,
                                 WAITING)
from tuner.metrics.window import (GENERATION_TOKENS, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES,
                                  PROMPT_TOKENS, REQUEST_SUCCESS, GaugeSample, HistogramDelta,
                                  MetricsWindow)

COUNTERS = (PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS)
HISTOGRAMS = (TTFT, ITL, E2EL, QUEUE_TIME, "request_prefill_time_seconds", "request_decode_time_seconds",
              ITERATION_TOKENS)
_OLD = {new: old for old, new in RENAMED.items()}
_DROP_LABELS = {"__name__", "engine", "model_name", "instance", "job"}


class PrometheusSource:
    """Query `url` (a Prometheus HTTP API root) for one load run's window.

    `selector` narrows every series to the server under test, as PromQL label matchers without braces,
    e.g. `job="vllm", instance="10.0.0.5:8000"`. `headers` go with every query (auth to the Prometheus
    server, not to vLLM). Failed queries are retried `retries` times, then raise.
    """

    def __init__(self, url: str, *, selector: str = "", headers: dict[str, str] | None = None,
                 timeout_s: float = 30.0, retries: int = 3):
        try:
            from prometheus_api_client import PrometheusConnect  # heavy import, only when used
        except ImportError:
            raise UserError("reading engine metrics from Prometheus needs the optional dependency: "
                            "pip install 'slo-tuner[prometheus]'", field="prometheus") from None
        from urllib3.util.retry import Retry

        retry = Retry(total=retries, backoff_factor=0.2, status_forcelist=[408, 429, 500, 502, 503, 504],
                      allowed_methods=["GET", "POST"])
        self.prom = PrometheusConnect(url=url, headers=headers, disable_ssl=False, timeout=timeout_s,
                                      retry=retry)
        self.selector = selector.strip().strip("{}")

    # --- PromQL text ---------------------------------------------------------------------------------
    def _series(self, name: str, suffix: str = "") -> str:
        return f"vllm:{name}{suffix}{{{self.selector}}}"

    def _either(self, name: str, template: str, suffix: str = "") -> str:
        """`template` applied to the current name, `or` to the old one where vLLM renamed it."""
        q = template.format(self._series(name, suffix))
        if name in _OLD:
            q = f"({q}) or ({template.format(self._series(_OLD[name], suffix))})"
        return q

    # --- queries -------------------------------------------------------------------------------------
    def _instant(self, query: str, at: float) -> list[dict[str, Any]]:
        return self.prom.custom_query(query=query, params={"time": f"{at:.3f}"})

    def _scalar(self, query: str, at: float) -> float:
        res = self._instant(query, at)
        if not res:
            return 0.0
        v = float(res[0]["value"][1])
        return 0.0 if math.isnan(v) else v

    def gauges(self, start_unix: float, end_unix: float, step_s: float, *, t0_unix: float | None = None,
               time_scale: float = 1.0) -> list[GaugeSample]:
        t0 = start_unix if t0_unix is None else t0_unix
        start, end = (dt.datetime.fromtimestamp(x, tz=dt.timezone.utc) for x in (start_unix, end_unix))
        # float seconds: Prometheus refuses a fractional duration such as "0.5s"
        step = f"{max(step_s, 0.001):g}"
        exact = {"start": f"{start_unix:.3f}", "end": f"{end_unix:.3f}"}
        series: dict[str, dict[float, float]] = {}
        for key, agg in ((RUNNING, "sum({})"), (WAITING, "sum({})"), (KV_USAGE, "avg({})")):
            # The client rounds start/end to whole seconds; the params override keeps milliseconds.
            res = self.prom.custom_query_range(query=self._either(key, agg), start_time=start,
                                               end_time=end, step=step, params=exact)
            series[key] = {float(ts): float(v) for r in res[:1] for ts, v in r["values"]}
        stamps = sorted(set().union(*(s.keys() for s in series.values())))
        return [GaugeSample(t=(ts - t0) / time_scale, running=series[RUNNING].get(ts, 0.0),
                            waiting=series[WAITING].get(ts, 0.0), kv_usage=series[KV_USAGE].get(ts, 0.0))
                for ts in stamps]

    def counters(self, start_unix: float, end_unix: float) -> dict[str, float]:
        rng = _range(start_unix, end_unix)
        return {key: self._scalar(self._either(key, f"sum(increase({{}}[{rng}]))", "_total"), end_unix)
                for key in COUNTERS}

    def histograms(self, start_unix: float, end_unix: float) -> dict[str, HistogramDelta]:
        rng = _range(start_unix, end_unix)
        out: dict[str, HistogramDelta] = {}
        for name in HISTOGRAMS:
            buckets = self._instant(self._either(name, f"sum by (le) (increase({{}}[{rng}]))", "_bucket"),
                                    end_unix)
            if not buckets:
                continue
            h = HistogramDelta(
                buckets=dict(sorted((float(b["metric"]["le"]), float(b["value"][1])) for b in buckets)),
                sum=self._scalar(self._either(name, f"sum(increase({{}}[{rng}]))", "_sum"), end_unix),
                count=self._scalar(self._either(name, f"sum(increase({{}}[{rng}]))", "_count"), end_unix))
            out[name] = h
        return out

    def cache_config(self, at_unix: float) -> dict[str, str]:
        res = self._instant(self._series("cache_config_info"), at_unix)
        return {k: v for r in res[:1] for k, v in r["metric"].items() if k not in _DROP_LABELS}

    def window(self, start_unix: float, end_unix: float, *, step_s: float = 0.5,
               t0_unix: float | None = None, time_scale: float = 1.0) -> MetricsWindow:
        """Everything `tuner.metrics.scrape.window` gives, from Prometheus, for [start, end]."""
        if end_unix <= start_unix:
            raise ValueError(f"empty window: {start_unix} .. {end_unix}")
        return MetricsWindow(
            samples=self.gauges(start_unix, end_unix, step_s, t0_unix=t0_unix, time_scale=time_scale),
            counters=self.counters(start_unix, end_unix),
            histograms=self.histograms(start_unix, end_unix),
            cache_config=self.cache_config(end_unix))

    def window_for_run(self, run, *, step_s: float = 0.5, margin_s: float = 0.0) -> MetricsWindow:
        """The window of a `LoadRun` (needs `run.started_unix`); `margin_s` (real seconds) widens it
        after the end so the scrape that saw the last requests finish is inside."""
        if run.started_unix is None:
            raise ValueError("the load run has no started_unix; it was not measured by the HTTP client")
        end = run.started_unix + run.duration_s * run.time_scale + margin_s
        return self.window(run.started_unix, end, step_s=step_s, t0_unix=run.started_unix,
                           time_scale=run.time_scale)


def _range(start_unix: float, end_unix: float) -> str:
    """A PromQL range covering the window, in whole milliseconds."""
    return f"{max(1, math.ceil((end_unix - start_unix) * 1000))}ms"
