"""A launched OpenAI-compatible server, driven over real HTTP.

Whatever started it (real vLLM, the HTTP simulator, a user's wrapper), the load is the same open-loop
replay through `tuner.replay.client.run_load_http`, so their numbers are comparable. This class only adds
what a subprocess needs: knowing the model name and key to send, stopping the whole process group, and
noticing when the server died *during* the load (a launch that came up can still OOM under load): that is
recorded on the `LoadRun` as a warning and in `died`, so the trial is not scored as a slow success.
"""

from __future__ import annotations

from typing import Sequence

from tuner import signals
from tuner.engine.base import LaunchFailure, LaunchInfo, Server
from tuner.engine.classify import classified_failure, classify_failure
from tuner.engine.launcher import ManagedProcess
from tuner.replay.client import run_load_http
from tuner.replay.record import LoadRun
from tuner.workload.model import WorkloadRequest


class HTTPServer(Server):
    """A healthy server process reachable at `info.base_url`."""

    def __init__(self, process: ManagedProcess, info: LaunchInfo, *, model: str, api_key: str | None = None,
                 api: str = "completions", engine_name: str = "http", stop_timeout_s: float = 30.0):
        self.process = process
        self.info = info
        self.model = model
        self.api_key = api_key
        self.api = api
        self.engine_name = engine_name
        self.stop_timeout_s = stop_timeout_s
        #: Set when the server exited while it should have been serving.
        self.died: LaunchFailure | None = None

    @property
    def base_url(self) -> str:
        return self.process.base_url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def check_alive(self) -> LaunchFailure | None:
        """None while the process runs; else the classified reason it exited (also kept in `died`)."""
        rc = self.process.poll()
        if rc is None:
            return None
        if self.died is None:
            kind, message = classify_failure(self.process.read_log(), returncode=rc)
            self.died = classified_failure(kind, f"server exited (code {rc}) after becoming healthy: {message}")
        return self.died

    def run_load(self, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                 offered_rate: float, request_timeout_s: float = 120.0, warmup_s: float = 0.0,
                 cooldown_s: float = 0.0, **client_options) -> LoadRun:
        """Replay `requests` open-loop against this server (see `run_load_http` for `client_options`)."""
        dead = self.check_alive()
        if dead is not None:
            raise dead
        options = {"model": self.model, "api": self.api, "api_key": self.api_key, "engine": self.engine_name,
                   **client_options}
        run = run_load_http(self.base_url, requests, send_times, offered_rate=offered_rate,
                            request_timeout_s=request_timeout_s, warmup_s=warmup_s, cooldown_s=cooldown_s,
                            **options)
        signals.check()  # a Ctrl-C whose cancellation landed as the run returned: still a stop
        dead = self.check_alive()
        if dead is not None:
            run.warnings.append(f"{dead.kind}: {dead.message}")
        return run

    def stop(self) -> None:
        self.process.stop(term_timeout_s=self.stop_timeout_s)

    def stop_interrupted(self) -> None:
        self.process.stop_interrupted()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            with signals.shielded():
                self.process.stop_interrupted()
        else:
            self.stop()
