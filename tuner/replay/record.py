"""What one load run measured, request by request, on the client's clock.

Both the HTTP replay client and the in-process simulator produce these, so scoring, diagnosis and reports
never know which engine measured them. Times are seconds relative to the start of the load run.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tuner.metrics.window import MetricsWindow


class RequestRecord(BaseModel):
    index: int
    scheduled_s: float
    sent_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    token_times: list[float] | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    expected_output_tokens: int = 0
    error: str | None = None
    in_window: bool = True
    #: When the request stopped occupying the server, from the client's side: `[DONE]`, the error, or
    #: the abort. None while in flight.
    end_s: float | None = None

    @property
    def truncated(self) -> bool:
        """Finished with fewer tokens than asked for, although EOS was ignored: never good (a server
        that stops early looks fast)."""
        return self.ok and 0 < self.output_tokens < self.expected_output_tokens

    @property
    def cause(self) -> str | None:
        """Why the request is not a complete response (None when it is one): see `error_cause`."""
        if self.error is not None:
            return error_cause(self.error)
        if self.finish_s is None:
            return "unfinished"
        return "truncated" if self.truncated else None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_s is not None

    @property
    def ttft(self) -> float | None:
        if self.first_token_s is None or self.sent_s is None:
            return None
        return self.first_token_s - self.sent_s

    @property
    def e2el(self) -> float | None:
        if self.finish_s is None or self.sent_s is None:
            return None
        return self.finish_s - self.sent_s

    @property
    def tpot(self) -> float | None:
        """(E2EL - TTFT) / (output_tokens - 1), 0 for one-token outputs (vLLM bench serve's definition)."""
        if self.ttft is None or self.e2el is None:
            return None
        if self.output_tokens <= 1:
            return 0.0
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        t = self.token_times or []
        return [b - a for a, b in zip(t, t[1:])]


#: The error texts of requests a stop rule left out (see `tuner.replay.client.StopWhen`).
NOT_SENT = "not sent"
CUT = "cut at decision"

#: Error causes, most specific first: (cause, substrings of the error text that identify it).
ERROR_CAUSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("over_context", ("maximum context length", "maximum model length", "max_model_len")),
    ("cut", ("cut at decision",)),
    ("not_sent", ("not sent",)),
    ("cancelled", ("cancelled",)),
    ("in_flight_cap", ("in-flight cap",)),
    ("timeout", ("timeout",)),
    ("stalled", ("stalled",)),
    ("http_4xx", ("HTTP 4",)),
    ("http_5xx", ("HTTP 5",)),
    ("connection", ("connection dropped", "ConnectError", "stream ended before")),
)
#: Causes that are the tool's own doing, not the server's: a request cut because the verdict was already
#: certain, or a cancelled run. Never good, never reported as a server error.
TOOL_CAUSES = frozenset({"cut", "cancelled", "not_sent"})


def error_cause(error: str) -> str:
    """The cause of a failed request, from its error text (vLLM's messages and the client's own)."""
    low = error.lower()
    for cause, needles in ERROR_CAUSES:
        if any(n.lower() in low for n in needles):
            return cause
    return "failed"


class ClientCheck(BaseModel):
    """Whether a load run measured the server or the client's own waiting (`tuner.replay.check`).

    Means are over every request that got a first token, on the client and in the server's histograms
    (the same population: the server's histograms are the difference of two scrapes around the run).
    """

    bound_ms: float
    #: Sends: how late the client sent its requests (sent_s - scheduled_s), p99.
    lateness_p99_ms: float | None = None
    client_ttft_mean_ms: float | None = None
    server_ttft_mean_ms: float | None = None
    client_e2e_mean_ms: float | None = None
    server_e2e_mean_ms: float | None = None
    server_queue_mean_ms: float | None = None
    #: Share of the run the client's event-loop thread spent runnable but waiting for a CPU (Linux
    #: schedstat); near 1 the client was starved by other processes.
    client_runq_share: float | None = None
    client_cpu_share: float | None = None
    #: The HTTP simulator: mean wall-clock lateness of its engine steps (its step loop behind the clock).
    sim_step_lateness_ms: float | None = None
    #: Why the run is the client's (or the simulator host's), not the server's; empty when it is the server's.
    reasons: list[str] = Field(default_factory=list)

    @property
    def client_bound(self) -> bool:
        return bool(self.reasons)

    def line(self) -> str:
        """The figures, one line: 'client mean TTFT 510 ms vs the server's 12 ms; sends p99 620 ms late'."""
        parts = []
        if self.client_ttft_mean_ms is not None and self.server_ttft_mean_ms is not None:
            parts.append(f"client mean TTFT {self.client_ttft_mean_ms:.0f} ms vs the server's own "
                         f"{self.server_ttft_mean_ms:.0f} ms")
        if self.client_e2e_mean_ms is not None and self.server_e2e_mean_ms is not None:
            parts.append(f"mean E2E {self.client_e2e_mean_ms:.0f} vs {self.server_e2e_mean_ms:.0f} ms")
        if self.lateness_p99_ms is not None:
            parts.append(f"sends p99 {self.lateness_p99_ms:.0f} ms late")
        if self.client_runq_share is not None:
            parts.append(f"client waited for a CPU {100 * self.client_runq_share:.0f}% of the run")
        if self.sim_step_lateness_ms is not None:
            parts.append(f"simulator steps {self.sim_step_lateness_ms:.1f} ms late on average")
        return "; ".join(parts)


class LoadRun(BaseModel):
    """One open-loop load run at one offered rate against one launched configuration."""

    offered_rate: float
    duration_s: float
    window_start_s: float = 0.0
    window_end_s: float = 0.0
    records: list[RequestRecord]
    metrics: MetricsWindow | None = None
    warnings: list[str] = Field(default_factory=list)
    engine: str = ""
    time_scale: float = 1.0
    #: True when the run was cancelled (Ctrl-C) before every request finished; unfinished ones carry
    #: error "cancelled".
    interrupted: bool = False
    #: Wall-clock (Unix) time of the run's t=0, to match server-side series (e.g. a Prometheus server).
    started_unix: float | None = None
    #: Set when a `stop_when` rule ended the run early: the run's time then. Requests scheduled later
    #: were not sent (`error` "not sent", never in the window).
    stopped_s: float | None = None
    #: The client's event-loop thread over the run (Linux `/proc/thread-self/schedstat`): seconds on a
    #: CPU, and seconds runnable but waiting for one. None where the kernel does not say.
    client_cpu_s: float | None = None
    client_runq_s: float | None = None
    #: Filled by `tuner.replay.check.check_run` (the caller knows the bound).
    client_check: ClientCheck | None = None
