"""The twin as an engine: the in-process simulator under fitted parameters.

Two things a fitted `TwinParams` changes beyond the cost model's numbers: a client-side latency per
request (HTTP, tokenisation and detokenisation happen outside vLLM's steps, so they add to TTFT and E2E
and not to the engine's load), and the KV pool, scaled by what the host's launches actually reserved.
"""

from __future__ import annotations

from typing import Sequence

from tuner.engine.sim import SimEngine, SimServer, replay_stop_rule
from tuner.knobs import Knobs
from tuner.profiles.gpus import GPUProfile
from tuner.profiles.models import ModelProfile
from tuner.replay.record import LoadRun
from tuner.sim.config import resolve
from tuner.sim.lora import LoraSetup
from tuner.slo import SLO
from tuner.storage.twin import TwinParams
from tuner.twin.params import cost_params, value
from tuner.workload.model import WorkloadRequest


class TwinServer(SimServer):
    def __init__(self, *args, client_overhead_s: float = 0.0, shapes: dict | None = None, **kw):
        super().__init__(*args, **kw)
        self.client_overhead_s = client_overhead_s
        self._shared_shapes = {} if shapes is None else shapes

    def _shape(self, req: WorkloadRequest, index: int) -> tuple[int, list[int]]:
        """Request shapes shared by every launch of the twin: the k-th load run of each configuration
        replays the same requests under the same salt (common random numbers), so their prompt block
        hashes are computed once per study, not once per configuration."""
        ids = req.prefix_hash_ids
        key = (index, req.prompt_tokens, ids[-1]) if ids else (index, id(req))
        hit = self._shared_shapes.get(key)
        if hit is None:
            hit = super()._shape(req, index)
            if len(self._shared_shapes) > 200_000:
                self._shared_shapes.clear()
            self._shared_shapes[key] = hit
        return hit

    def run_load(self, requests: Sequence[WorkloadRequest], send_times: Sequence[float], *,
                 stop_when=None, **kw) -> LoadRun:
        run = super().run_load(requests, send_times, **kw)
        o = self.client_overhead_s
        if o:  # written into each fresh record's fields directly: pydantic's setattr cost a tenth of a replay
            for r in run.records:
                d = r.__dict__
                if d["first_token_s"] is not None:
                    d["first_token_s"] += o
                if d["finish_s"] is not None:
                    d["finish_s"] += o
                    if d["end_s"] is not None:
                        d["end_s"] += o
                if d["token_times"]:
                    d["token_times"] = [t + o for t in d["token_times"]]
        if stop_when is not None:  # judged on what the client would have seen
            replay_stop_rule(run, stop_when, max(send_times, default=0.0))
        return run


class TwinEngine(SimEngine):
    """`SimEngine` with a fitted cost model, client latency and KV scale; deterministic (no noise)."""

    name = "twin"

    def __init__(self, gpu: str | GPUProfile, model: str | ModelProfile, params: TwinParams, *,
                 token_times: bool = False, shapes: dict | None = None, lora: LoraSetup | None = None):
        """`shapes`: a cache of request shapes to share with other twin engines of the same study;
        `lora`: the adapters the engine serves."""
        super().__init__(gpu, model, cost_params=cost_params(params), token_times=token_times)
        self.lora = lora
        self.params = params
        self.shapes: dict = {} if shapes is None else shapes

    @classmethod
    def for_slo(cls, gpu: str | GPUProfile, model: str | ModelProfile, params: TwinParams, slo: SLO, *,
                shapes: dict | None = None, lora: LoraSetup | None = None) -> "TwinEngine":
        """The twin engine that judges `slo`: the one way every part of the twin (fit, anchors,
        predictions) builds it, so they all simulate the same engine."""
        return cls(gpu, model, params, token_times=slo.needs_token_times, shapes=shapes, lora=lora)

    def launch(self, knobs: Knobs) -> TwinServer:
        self.launches += 1
        cfg = resolve(self.gpu, self.model, knobs, host_gpus=self.host_gpus, lora=self.lora)
        if self.params.kv_scale != 1.0:
            blocks = max(1, int(cfg.num_gpu_blocks * self.params.kv_scale))
            cfg = cfg.model_copy(update={"num_gpu_blocks": blocks})
        return TwinServer(cfg, self.cost_params, 0.0, 0, self.token_times, self.tokens,
                          client_overhead_s=value(self.params, "client_overhead_s"), shapes=self.shapes)
