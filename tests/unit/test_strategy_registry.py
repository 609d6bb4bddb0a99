"""A strategy from outside the package: registered by name, `tune --strategy NAME` runs a study with it,
exactly as the built-in strategies run (they are registered the same way, one module each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.knobs import Knobs
from tuner.search.strategies import BUILTIN, StrategyRun, get, names, register_strategy
from tuner.search.strategy import Outcome

NAME = "outside-baseline-only"
ROOT = Path(__file__).resolve().parents[2]


@register_strategy(NAME)
def baseline_only(run: StrategyRun) -> Outcome:
    """A third-party strategy: launches vLLM's defaults once and stands on them."""
    base = run.runner.evaluate(Knobs(), role="baseline")
    run.note(f"{NAME}: one launch")
    return Outcome(base, base if base.capacity_rps else None, f"{NAME} done", [base.number])


def test_the_built_in_strategies_are_registered_by_name() -> None:
    assert set(BUILTIN) == {"guided", "twin", "tpe", "random", "grid"}
    for name in BUILTIN:
        assert get(name).name == name
    assert get("guided").replays_stored and not get("tpe").replays_stored
    assert NAME in names()


def test_an_unknown_strategy_is_a_user_error_naming_the_option() -> None:
    from tuner.study import settings_from_options

    with pytest.raises(UserError, match="--strategy: unknown strategy 'annealing'"):
        settings_from_options({"strategy": "annealing"})
    assert settings_from_options({"strategy": NAME}).search.strategy == NAME


def test_a_study_runs_with_the_outside_strategy(tmp_path: Path) -> None:
    from tuner.study import run_tune, settings_from_options

    notes: list[str] = []

    class Notes:
        def trial_started(self, number, knobs, role): pass
        def point(self, number, point): pass
        def trial_done(self, record): pass
        def incumbent_changed(self, record): pass
        def note(self, text): notes.append(text)

    out = tmp_path / "run"
    settings = settings_from_options(dict(
        workload=ROOT / "workloads" / "chat.jsonl", slo=ROOT / "workloads" / "chat.slo.yaml", out=out,
        gpu="rtx4090", model="qwen2.5-7b", strategy=NAME, requests_per_run=200, write_outputs=False))
    outcome, _ = run_tune(settings, Notes())
    assert outcome.stop_reason == f"{NAME} done" and outcome.baseline is not None
    assert outcome.baseline.capacity_rps and f"{NAME}: one launch" in notes
    from tuner.storage.reader import load_study_data

    assert load_study_data(out).info.settings.search.strategy == NAME  # stored as it was given
