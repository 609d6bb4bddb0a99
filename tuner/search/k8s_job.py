"""A Kubernetes Job of `tune worker` pods for a study on a shared database (issue 59, item 4).

The scale-out engine is the one the workers already use: Optuna's storage on PostgreSQL hands each pod
the next queued configuration, heartbeats find a dead pod's trial and queue it again
(`tuner.search.worker`). Kubernetes only places the pods: one per device set, each requesting its GPUs
(`nvidia.com/gpu`, so the device plugin sets `CUDA_VISIBLE_DEVICES`), the storage URL from a Secret (it
may carry a password: never in the manifest), the study's input files from a volume mounted where the
study ran (its recorded `cwd`, so its relative paths read as they did). Ray would place tensor-parallel
groups across nodes, which a study does not need: one trial is one server on one node.
"""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.storage.records import StudyInfo

#: where each pod keeps its servers' logs (the study itself is in the database)
POD_RUN_DIR = "/var/run/slo-tuner"


def input_files(info: StudyInfo) -> list[Path]:
    """The study's input files as it recorded them, each checked to lie under the directory it ran in
    (the one directory a pod mounts)."""
    root = Path(info.cwd) if info.cwd else None
    # a relative path was relative to the directory the study ran in, the one the pod mounts
    files = [Path(p) if Path(p).is_absolute() or root is None else root / p
             for p in (info.settings.workload, info.settings.slo) if p is not None]
    for f in files:
        if root is None or not f.is_relative_to(root):
            raise UserError(f"{f} is outside the directory the study ran in ({root}): a pod mounts that "
                            "directory only; start the study from a directory that holds its inputs",
                            field="--out")
    return files


def worker_job(info: StudyInfo, *, name: str, image: str, pods: int, gpus_per_pod: int, secret: str,
               secret_key: str, inputs_claim: str, vllm_python: str | None) -> dict:
    """The Job manifest (a dict for YAML): `pods` workers side by side, each with `gpus_per_pod` GPUs."""
    input_files(info)
    args = ["worker", "--out", POD_RUN_DIR]  # the storage URL: env TUNER_STORAGE_URL, from the Secret
    if vllm_python:
        args += ["--vllm-python", vllm_python]
    container = {
        "name": "worker", "image": image, "command": ["tune"], "args": args, "workingDir": info.cwd,
        "env": [{"name": "TUNER_STORAGE_URL",
                 "valueFrom": {"secretKeyRef": {"name": secret, "key": secret_key}}},
                {"name": "VLLM_API_KEY",
                 "valueFrom": {"secretKeyRef": {"name": secret, "key": "vllm-api-key", "optional": True}}}],
        "resources": {"limits": {"nvidia.com/gpu": gpus_per_pod}} if gpus_per_pod else {},
        "volumeMounts": [{"name": "inputs", "mountPath": info.cwd, "readOnly": True},
                         {"name": "run", "mountPath": POD_RUN_DIR}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "slo-tuner-worker"}},
        "spec": {
            # each pod works the queue until it is empty: the Job is done when every pod is
            "parallelism": pods, "completions": pods, "completionMode": "Indexed",
            # a pod that dies loses nothing (its trial goes stale and is run again): replace it a few times
            "backoffLimit": 2 * pods,
            "template": {"spec": {
                "restartPolicy": "Never", "containers": [container],
                "volumes": [{"name": "inputs", "persistentVolumeClaim": {"claimName": inputs_claim,
                                                                          "readOnly": True}},
                            {"name": "run", "emptyDir": {}}]}}}}
