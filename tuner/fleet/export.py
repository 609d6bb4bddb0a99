"""What a platform team deploys: the verified fleet as the vLLM production stack's Helm values, a KEDA
`ScaledObject` on the summed waiting queue, and the vLLM Router's command line.

- `values.yaml` for the production stack's chart (github.com/vllm-project/production-stack, `helm/`):
  one `servingEngineSpec.modelSpec` entry with `replicaCount` = the verified N + 1 spare (the N-1 check
  shows the verified N alone does not survive a failure), `requestGPU` = tensor parallel size, the tuned
  knobs as `vllmConfig.extraArgs` (their vLLM flags, `Knobs.flags`; for cache_aware also
  `--enable-scale-out`, whose render endpoints the vLLM Router reads token ids from), `vllmConfig.tensorParallelSize`, and
  `keda` (the chart renders its own ScaledObject from it) with the validated threshold; `routerSpec.
  routingLogic` is the stack's nearest to the verified policy: round_robin -> roundrobin, consistent_hash
  -> session, cache_aware -> prefixaware. The stack's prefixaware router is its own (no load-balance
  thresholds), so a cache_aware verification does not carry over to it: the file says so.
- `scaledobject.yaml`: the same autoscaling as a standalone KEDA ScaledObject (keda.sh/v1alpha1), query
  `sum(vllm:num_requests_waiting{model="..."})`, threshold = the validated one (AverageValue: desired =
  ceil(sum / threshold)), min = the verified N + 1 (the scenario from N - 2 shows what a lower floor
  costs), max = the most the scenario used, scale-down stabilisation = its cooldown.
- `router.txt`: `vllm-router --policy P --worker-urls ...` with the verified policy, for a fleet fronted
  by the vLLM Router itself.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tuner.fleet.policies import SCALE_OUT_FLAG
from tuner.fleet.verify import FleetVerification
from tuner.knobs import Knobs

#: The production stack's routingLogic nearest to each vLLM Router policy (None: it has none).
STACK_ROUTING = {"round_robin": "roundrobin", "consistent_hash": "session", "cache_aware": "prefixaware",
                 "random": None, "power_of_two": None}
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"  # the chart's own default trigger address


def _model_name(v: FleetVerification) -> str:
    return (v.model or "model").replace("/", "-").replace(".", "-").lower()


def autoscaling(v: FleetVerification) -> dict:
    """The autoscaling the scenario validated: threshold, bounds, cooldown, polling."""
    auto = next((s for s in v.scenarios if s.name == "autoscale"), None)
    n = v.chosen.verified_n or v.plan_n
    # the floor is the verified fleet with its spare: the scenario that started from N - 2 shows what a
    # lower floor costs at the peak (its SLO-broken seconds), so it is not exported
    return {"threshold": v.threshold if v.threshold is not None else 5.0, "min": n + 1,
            "max": auto.max_replicas if auto and auto.max_replicas > n + 1 else 2 * n + 2,
            "cooldown": 120, "polling": 15}


def helm_values(v: FleetVerification) -> dict:
    policy = v.chosen.policy
    n = (v.chosen.verified_n or v.plan_n) + 1
    name = _model_name(v)
    a = autoscaling(v)
    knobs = Knobs.stored(v.knobs)
    args = [f for f in knobs.flags() if not f.startswith("--tensor-parallel-size")]
    if policy == "cache_aware":  # the vLLM Router's cache_aware reads token ids from the render endpoints
        args.append(SCALE_OUT_FLAG)
    spec = {"name": name, "repository": "vllm/vllm-openai", "tag": "latest", "modelURL": v.model or "",
            "replicaCount": n, "requestCPU": 8, "requestMemory": "32Gi", "requestGPU": v.tp,
            "vllmConfig": {"tensorParallelSize": v.tp,
                           "extraArgs": args},
            "keda": {"enabled": True, "minReplicaCount": a["min"], "maxReplicaCount": a["max"],
                     "pollingInterval": a["polling"], "cooldownPeriod": a["cooldown"],
                     "triggers": [_trigger(name, a["threshold"])]}}
    router: dict = {"routingLogic": STACK_ROUTING.get(policy) or "roundrobin"}
    if policy == "consistent_hash":
        router["sessionKey"] = "x-session-id"
    return {"servingEngineSpec": {"enableEngine": True, "modelSpec": [spec]}, "routerSpec": router}


def _trigger(name: str, threshold: float) -> dict:
    return {"type": "prometheus", "metadata": {
        "serverAddress": PROMETHEUS, "metricName": "vllm:num_requests_waiting",
        "query": f'sum(vllm:num_requests_waiting{{model="{name}"}})', "threshold": f"{threshold:g}"}}


def scaled_object(v: FleetVerification) -> dict:
    name = _model_name(v)
    a = autoscaling(v)
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": f"{name}-scaledobject"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{name}-vllm"},
                     "minReplicaCount": a["min"], "maxReplicaCount": a["max"], "pollingInterval": a["polling"],
                     "cooldownPeriod": a["cooldown"],
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {
                         "stabilizationWindowSeconds": a["cooldown"],
                         "policies": [{"type": "Pods", "value": 1, "periodSeconds": a["polling"]}]}}}},
                     "triggers": [_trigger(name, a["threshold"])]}}


def _broken(v: FleetVerification) -> str:
    """How long the SLO stayed broken in the threshold's own scenario, and from how many replicas."""
    sc = next((s for s in v.scenarios if s.name == "autoscale" and s.threshold == v.threshold), None)
    return f"{sc.broken_s:g} s from {sc.replicas_start} replicas" if sc else "its scenario not kept"


def _header(v: FleetVerification) -> str:
    policy = v.chosen.policy
    lines = [f"# Written by slo-tuner `tune plan --verify` from {v.run_dir}: verified N = {v.chosen.verified_n} "
             f"under {policy} at {v.peak:g} req/s (virtual time), + 1 spare.",
             f"# Autoscaling threshold {v.threshold:g} waiting requests per replica: the autoscale scenario's "
             f"least SLO-broken time ({_broken(v)}); its floor is the verified N + 1."
             if v.threshold is not None
             else "# No autoscaling scenario was run."]
    stack = STACK_ROUTING.get(policy)
    if stack is None:
        lines.append(f"# The production stack's router has no {policy}: roundrobin is set; front the engines "
                     "with the vLLM Router (router.txt) to keep the verified policy.")
    elif policy == "cache_aware":
        lines.append("# cache_aware was verified as the vLLM Router implements it; the stack's prefixaware is a "
                     "different router (no load-balance thresholds): verify it before relying on it.")
    return "\n".join(lines) + "\n"


def write_export(v: FleetVerification, out: Path) -> list[Path]:
    """values.yaml, scaledobject.yaml and router.txt under `out` (nothing when no N was verified)."""
    if v.chosen.verified_n is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    head = _header(v)
    values, so, router = out / "values.yaml", out / "scaledobject.yaml", out / "router.txt"
    values.write_text(head + yaml.safe_dump(helm_values(v), sort_keys=False))
    so.write_text(head + yaml.safe_dump(scaled_object(v), sort_keys=False))
    n = v.chosen.verified_n + 1
    urls = " ".join(f"http://{_model_name(v)}-{i}:8000" for i in range(n))
    note = (f"# the engines run with {SCALE_OUT_FLAG} (values.yaml): without it vLLM 0.32 refuses the render "
            "endpoints and every cache_aware decision falls back to the least-loaded worker\n"
            if v.chosen.policy == "cache_aware" else "")
    router.write_text(f"{note}vllm-router --policy {v.chosen.policy} --worker-urls {urls}\n")
    return [values, so, router]


__all__ = ["helm_values", "scaled_object", "write_export", "STACK_ROUTING", "autoscaling"]
