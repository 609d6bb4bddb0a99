"""`--engine sim-http`: the HTTP simulator as a subprocess, launched and driven exactly like `vllm serve`.

Why a second simulated engine when the in-process one is faster: this one exercises the whole real-vLLM
path (the shared launcher's process group, health wait, log capture and failure classification, the
open-loop HTTP replay, `/metrics` scraping, SIGTERM/SIGKILL stop and port release) on a machine without a
GPU. A launch vLLM would refuse exits before binding its port with vLLM's message, so the classifier sees
the same log it would see from vLLM.

`time_scale` K makes the simulated GPU K times slower than real so a small CPU serves every token on time;
the server reports K in `/v1/models` and the replay client divides its timings by it, so load runs read
as if the GPU ran at full speed (and take K times longer).
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar, Sequence

from tuner.engine import launcher
from tuner.engine.base import Engine
from tuner.engine.http import HTTPServer
from tuner.engine.simulated import SimulatedEngineChecks
from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.profiles.gpus import GPUProfile, get_gpu
from tuner.profiles.models import ModelProfile, get_model

HOST = "127.0.0.1"


class SimHTTPEngine(SimulatedEngineChecks, Engine):
    """One `python -m tuner.cli.serve_sim` server per `launch`, each in its own run directory (log, pidfile)."""

    name: ClassVar[str] = "sim-http"

    @classmethod
    def from_spec(cls, spec) -> "SimHTTPEngine":
        cls.needs_gpu_and_model(spec)
        return cls(spec.gpu, spec.model, time_scale=spec.time_scale, run_dir=spec.run_dir,
                   api_key=spec.api_key, noise=spec.noise, seed=spec.seed, extra_args=spec.extra_args,
                   spec_acceptance=spec.spec_acceptance, lora_dir=spec.lora_dir)

    def __init__(self, gpu: str | GPUProfile, model: str | ModelProfile, *, time_scale: float = 1.0,
                 run_dir: str | Path | None = None, api_key: str | None = None,
                 startup_timeout_s: float = 60, noise: float = 0.0, seed: int = 0,
                 api: str = "completions", stop_timeout_s: float = 10.0, extra_args: Sequence[str] = (),
                 spec_acceptance: dict[str, float] | None = None, lora_dir: str | None = None):
        if not time_scale > 0:
            raise UserError(f"must be > 0, got {time_scale}", field="time_scale")
        # Fail on an unknown GPU or model here, once, rather than as a "crash" of every launch.
        self.gpu = gpu.name if isinstance(gpu, GPUProfile) else gpu
        self.model = model.name if isinstance(model, ModelProfile) else model
        get_gpu(self.gpu)
        get_model(self.model)
        self.time_scale = float(time_scale)
        self.run_root = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="sim-http-"))
        self.api_key = api_key
        self.startup_timeout_s = startup_timeout_s
        self.noise = noise
        self.seed = seed
        self.api = api
        self.stop_timeout_s = stop_timeout_s
        self.extra_args = list(extra_args)  # more `vllm serve` flags, after the knobs (as VllmEngine)
        self.spec_acceptance = dict(spec_acceptance or {})
        self.lora_dir = lora_dir  # LoRA on, serving these adapters (`tuner.lora.catalog`)
        self.launches = 0
        self._counter = itertools.count(1)

    def argv(self, knobs: Knobs, port: int) -> list[str]:
        """The exact command a launch runs (the API key travels in the environment, never here)."""
        return [sys.executable, "-m", "tuner.cli.serve_sim", "--gpu", self.gpu, "--model", self.model,
                "--host", HOST, "--port", str(port), "--time-scale", repr(self.time_scale),
                "--noise", repr(self.noise), "--seed", str(self.seed + self.launches),
                *(f"--spec-acceptance={m}={a!r}" for m, a in sorted(self.spec_acceptance.items())), *knobs.flags(),
                *(["--enable-lora", "--lora-dir", str(self.lora_dir)] if self.lora_dir else []), *self.extra_args]

    def launch(self, knobs: Knobs, *, run_dir: str | Path | None = None) -> HTTPServer:
        """Start the simulator with `knobs`, wait for `/health`; raise a classified `LaunchFailure`."""
        self.launches += 1
        port = launcher.free_port(HOST)
        if run_dir is None:
            run_dir = self.run_root / f"launch-{next(self._counter):03d}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        env, headers = {}, {}
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
            headers["Authorization"] = f"Bearer {self.api_key}"
        proc, info = launcher.launch(self.argv(knobs, port), run_dir=run_dir, port=port, host=HOST, env=env,
                                     startup_timeout_s=self.startup_timeout_s, headers=headers,
                                     stop_timeout_s=self.stop_timeout_s)
        return HTTPServer(proc, info, model=self.model, api_key=self.api_key, api=self.api,
                          engine_name=self.name, stop_timeout_s=self.stop_timeout_s)
