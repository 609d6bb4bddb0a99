"""Regression gate: a CI check that the tuned configuration still serves what the tuning run measured.

Every run leaves `gate.yaml`: the tuned knobs, the engine/GPU/model, the workload and SLO files with their
SHA-256, the measured capacity with its bracket and confidence interval, and a tolerance (10%). `tune gate`
launches that configuration again (with the study runner's own engine, load-run and scoring code), warms
it with one run at half the rate, and measures at capacity x (1 - tolerance): the SLO must still hold
there. Runs there are pooled (up to three, fresh draws each) while the verdict is inside the noise, and
only an attainment whose whole 95% interval lies below the target fails. With `--full` it also
re-measures the capacity. The rate is below the knee by the tolerance on purpose: a check exactly at the
knee would fail half the time on noise alone.

The gate launches with every server argument the study used: the knobs' flags and the study's
`--vllm-arg`s (`extra_args`; a `--vllm-arg` given to `tune gate` replaces them), so a configuration tuned
with extra flags is not reported as a regression for failing to launch without them.

Inputs that changed since the gate was written are reported as such and stop the gate (exit 2) unless
`--allow-changed`: a new workload has a new knee, and comparing against the old one would be silent
nonsense. Exit codes: 0 pass, 1 regression (no launch, SLO broken at the gated rate, capacity dropped
beyond the tolerance), 2 bad input.
"""

from __future__ import annotations

from tuner.gate.file import (DEFAULT_TOLERANCE, QUALITY_REFERENCE, FileRef, GateFile, GateQuality, apply_overrides,
                             default_load, load_gate, load_settings, write_gate)
from tuner.gate.output import Check, GateResult, format_result, write_junit
from tuner.gate.run import GATE_SEED, GROSS, MAX_RUNS, check_rate, engine_settings, make_engine, run_gate

__all__ = ["DEFAULT_TOLERANCE", "QUALITY_REFERENCE", "FileRef", "GateFile", "GateQuality", "apply_overrides",
           "default_load", "load_gate", "load_settings", "write_gate", "format_result", "write_junit", "GATE_SEED",
           "GROSS", "MAX_RUNS", "Check", "GateResult", "check_rate", "engine_settings", "make_engine", "run_gate"]
