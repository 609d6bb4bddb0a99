"""What one load run measured, request by request, on the client's clock.

Both the HTTP replay client and the in-process simulator produce these, so scoring, diagnosis and reports
never know which engine measured them. Times are seconds relative to the start of the load run.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, Field

from tuner.metrics.window import MetricsWindow
from tuner.storage.records import ClientCheck


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
    #: Prompt tokens the server found in its prefix cache when it first scheduled the request, where the
    #: engine tells (the simulator does; None: not known). A "no" names the cold-prefix tail from it.
    cached_tokens: int | None = None

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


@lru_cache(maxsize=4096)  # a load run's few distinct error texts, asked for once per request per look
def error_cause(error: str) -> str:
    """The cause of a failed request, from its error text (vLLM's messages and the client's own)."""
    low = error.lower()
    for cause, needles in ERROR_CAUSES:
        if any(n.lower() in low for n in needles):
            return cause
    return "failed"


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
    #: Measured in real time by the HTTP client (not simulated in virtual time): its timings may be the
    #: client's own waiting, which `tuner.replay.check` tells apart.
    wall_clock: bool = False
    #: Filled by `tuner.replay.check.check_run` (the caller knows the bound).
    client_check: ClientCheck | None = None
