"""The Kubernetes Job of `tune worker` pods (issue 59, item 4): one pod per device set with its GPUs, the
storage URL only by reference to a Secret, the study's inputs mounted where it ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner.errors import UserError
from tuner.search.k8s_job import worker_job
from tuner.settings import from_options
from tuner.storage.records import StudyInfo


def info(cwd: Path, workload: str = "w.jsonl") -> StudyInfo:
    s = from_options(dict(workload=Path(workload), slo=Path("s.yaml"), engine="vllm",
                          storage="postgresql://u:pw@db/study"))
    return StudyInfo(settings=s, workload_sha256="a", workload_requests=1, workload_mean_prompt_tokens=1.0,
                     workload_mean_output_tokens=1.0, slo_sha256="b", slo={}, simulated=False, cwd=str(cwd))


def build(i: StudyInfo, **kw) -> dict:
    args = dict(name="w", image="img:1", pods=4, gpus_per_pod=2, secret="db", secret_key="url",
                inputs_claim="inputs", vllm_python=None)
    return worker_job(i, **{**args, **kw})


def test_one_pod_per_device_set_each_with_its_gpus_and_no_secret_in_the_manifest(tmp_path: Path) -> None:
    job = build(info(tmp_path))
    text = yaml.safe_dump(job)
    assert "pw@" not in text and "postgresql" not in text  # the URL is a Secret's, by reference
    spec = job["spec"]
    assert spec["parallelism"] == spec["completions"] == 4
    (c,) = spec["template"]["spec"]["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["args"][:2] == ["worker", "--out"] and not any("storage" in a for a in c["args"])
    url = next(e for e in c["env"] if e["name"] == "TUNER_STORAGE_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "db", "key": "url"}
    mount = next(m for m in c["volumeMounts"] if m["name"] == "inputs")
    assert mount["mountPath"] == str(tmp_path) == c["workingDir"] and mount["readOnly"]


def test_inputs_outside_the_study_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="outside the directory the study ran in"):
        build(info(tmp_path / "study", workload=str(tmp_path / "elsewhere.jsonl")))
