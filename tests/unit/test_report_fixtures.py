"""A small tuner study written by the real trial runner on the in-process simulator, for the report, plan
and gate tests.

Qwen2.5-7B on an RTX 4090 with the chat workload and SLO (the seed scenario). Instead of letting a
strategy choose, the test picks the trials, so every state the report must handle is in the storage:
the baseline, an accepted candidate, a candidate raced out at the incumbent's capacity (PRUNED), one that
fails to launch (FAIL, a classified launch failure), and one more candidate. The storage is exactly what
`tune` writes (`study.db`, `study_name.txt`, the `info`, `record` and `outcome` attributes): the input of
the tests, written by the code that writes it in production, not a stand-in.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tuner.knobs import Knobs

WORKLOAD = ROOT / "workloads" / "chat.jsonl"
SLO_FILE = ROOT / "workloads" / "chat.slo.yaml"
GPU, MODEL = "rtx4090", "Qwen/Qwen2.5-7B-Instruct"


def make_study(run_dir: Path) -> Path:
    """Run the chosen trials into `run_dir` (about 10 s of CPU); returns `run_dir`."""
    from tuner.capacity.knee import KneeSettings
    from tuner.search.runner import TrialRunner
    from tuner.study import (STUDY_NAME, engine_defaults, load_settings, make_engine, open_study, prepare,
                             settings_from_options, storage_url, study_info)

    opts = settings_from_options(dict(workload=WORKLOAD, slo=SLO_FILE, out=run_dir, gpu=GPU, model=MODEL,
                                      write_outputs=False))
    workload, slo, space = prepare(opts)
    run_dir.mkdir(parents=True, exist_ok=True)
    study = open_study(storage_url(opts), create=True, resume=False)
    (run_dir / "study_name.txt").write_text(STUDY_NAME + "\n")
    study.set_user_attr("info", study_info(opts, workload, slo, space).model_dump(mode="json"))
    engine = make_engine(opts)
    runner = TrialRunner(study=study, engine=engine, workload=workload, slo=slo, space=space,
                         load=load_settings(opts, engine), knee=KneeSettings(),
                         defaults=engine_defaults(opts), start_rate=1.0)
    base = runner.evaluate(Knobs(), role="baseline")
    inc = base
    for knobs, changed in [(Knobs(kv_cache_dtype="fp8"), "kv_cache_dtype"),
                           (Knobs(kv_cache_dtype="fp8", max_num_seqs=16), "max_num_seqs"),
                           (Knobs(kv_cache_dtype="fp8", gpu_memory_utilization=0.999), "gpu_memory_utilization"),
                           (Knobs(kv_cache_dtype="fp8", quantization="fp8"), "quantization")]:
        keep = knobs.set_only()
        base_knobs = Knobs(**{k: v for k, v in keep.items() if k != changed})
        if base_knobs.set_only() != inc.knobs:  # each candidate turns one knob of the incumbent
            knobs = Knobs(**{**inc.knobs, changed: keep[changed]})
        rec = runner.evaluate(knobs, changed_knob=changed, race_rate=inc.capacity_rps,
                              incumbent=inc.capacity_rps, accept_above=inc.capacity_rps * 1.05)
        if rec.accepted:
            inc = rec
    study.set_user_attr("outcome", {"stop_reason": "test", "baseline_trial": base.number,
                                    "tuned_trial": inc.number, "launches": runner.launches,
                                    "engine_s": runner.engine_s})
    return run_dir


_CACHE: dict[str, Path] = {}


def fixture_study(tmp_path_factory: pytest.TempPathFactory, dest: Path | None = None) -> Path:
    """The study, built once per test session; `dest` gets a private copy a test may modify."""
    if "run" not in _CACHE:
        _CACHE["run"] = make_study(tmp_path_factory.mktemp("study") / "run")
    if dest is None:
        return _CACHE["run"]
    shutil.copytree(_CACHE["run"], dest)
    return dest


def test_fixture_study_has_every_trial_state(tmp_path_factory):
    from tuner.storage.reader import load_study_data

    data = load_study_data(fixture_study(tmp_path_factory))
    states = [t.state for t in data.trials]
    assert states[0] == "COMPLETE" and data.trials[0].record.role == "baseline"
    assert {"COMPLETE", "PRUNED", "FAIL"} <= set(states), states
    failed = next(t for t in data.trials if t.state == "FAIL")
    assert failed.record.launch_failure_kind == "memory_utilization"
    assert data.outcome["tuned_trial"] in [t.number for t in data.trials]
    assert all(t.record.capacity_rps for t in data.trials if t.state == "COMPLETE")
