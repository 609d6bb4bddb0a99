"""The tiny interface between the tuner and whatever serves the model.

Like httpx's transports: the tuner only calls `Engine.launch(knobs)` and `Server.run_load(...)`; the
in-process simulator (virtual time), the HTTP simulator (a subprocess) and real `vllm serve` differ only
behind this line. A launch that fails raises `LaunchFailure` with a classified `kind`, so the search can
learn from it (a utilisation that OOMs rules out higher ones) instead of just seeing "failed".
"""

from __future__ import annotations

import abc
from typing import ClassVar, Sequence

from pydantic import BaseModel

from tuner.failures import LaunchFailure, LaunchFailureKind  # noqa: F401  (re-exported)
from tuner.knobs import Knobs
from tuner.replay.record import LoadRun
from tuner.workload.model import WorkloadRequest

class LaunchInfo(BaseModel):
    """What a healthy launch told us about itself (parsed from its log, or known to the simulator)."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    startup_s: float = 0.0
    log_path: str | None = None
    base_url: str | None = None


class Server(abc.ABC):
    """One launched configuration. Use as a context manager so it is always stopped.

    Everything the tool calls on a server is declared here (`info`, `model`, `headers`, `run_load`,
    `stop`, `stop_interrupted`); what an engine adds beyond it is its own business."""

    info: LaunchInfo
    #: the model name the server answers to in the OpenAI API; None where it does not check it
    model: str | None = None

    @abc.abstractmethod
    def run_load(self, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                 offered_rate: float, request_timeout_s: float = 120.0,
                 warmup_s: float = 0.0, cooldown_s: float = 0.0, prompt_salt: int | None = None,
                 stop_when=None) -> LoadRun:
        """Send `requests[i]` at `send_times[i]` seconds (open loop) and measure every one.

        `stop_when(records, now)` (see `tuner.replay.client.StopWhen`) may end the run early once its
        verdict is certain: the sequential test of `tuner.capacity.verdict`.

        `prompt_salt` changes the request-unique part of synthesised prompts (shared prefixes stay
        shared): a knee search replays the same requests at several rates, and without a fresh salt per
        load run the server's prefix cache would remember every prompt of the previous run.

        Engines also take `max_concurrency=C` (a closed loop: at most C requests in flight, a due send
        waits for a slot; `tuner.replay.client`); callers pass it only when set."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the server and release everything it held (process group, port, GPU memory)."""

    def stop_interrupted(self) -> None:
        """`stop` after a Ctrl-C or SIGTERM, bounded in time (a process engine waits less before it kills:
        `tuner.engine.http.HTTPServer`). The study calls it on the server of the interrupted trial."""
        self.stop()

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers a client of this server sends (an API key); {} for none or an in-process engine."""
        return {}

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Engine(abc.ABC):
    """A way to launch servers. One instance per study; `launch` once per trial."""

    name: ClassVar[str]
    #: True when load runs take virtual time (the in-process simulator): the tuner may run many.
    virtual_time: ClassVar[bool] = False

    #: True when its numbers come from a simulator, not a real server (reports say SIMULATED).
    simulated: ClassVar[bool] = False

    @classmethod
    def from_spec(cls, spec) -> "Engine":
        """Build from an `tuner.engine.registry.EngineSpec`; an engine that `create` builds defines it."""
        raise NotImplementedError(f"{cls.__name__} has no from_spec")

    @classmethod
    def unsupported_value(cls, values: dict[str, list]) -> tuple[str, str] | None:
        """(knob, why) for a knob value in `values` (knob -> candidate values) this engine can never
        launch, so a study is refused before it starts; None when it can try them all."""
        return None

    @classmethod
    def check_extra_args(cls, args: Sequence[str]) -> None:
        """Raise `UserError` naming `--vllm-arg` for extra server arguments this engine would refuse."""

    @classmethod
    def check_model(cls, model: str | None) -> None:
        """Raise `UserError` naming `--model` for a local model this engine would fail to load."""

    @abc.abstractmethod
    def launch(self, knobs: Knobs) -> Server:
        """Start a server with these knobs and wait until it is healthy, or raise `LaunchFailure`."""
