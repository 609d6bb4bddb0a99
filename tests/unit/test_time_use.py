"""Where a study's time went (`tuner.report.time_use`): sums of the trials' own records, the time between
trials from Optuna's trial times, and nothing where the records do not say."""

from __future__ import annotations

from tuner.knobs import Knobs
from tuner.report.time_use import set_use_rows, time_use, time_use_rows
from tuner.storage.reader import TrialView
from tuner.storage.records import TrialRecord


def _trial(n: int, start: float, wall: float, launch: float, load: float, engine: float = 0.0) -> TrialView:
    rec = TrialRecord(number=n, role="baseline" if n == 0 else "candidate", knobs=Knobs(), wall_s=wall,
                      launch_s=launch, load_wall_s=load, engine_s=engine)
    return TrialView(number=n, state="COMPLETE", record=rec, started_unix=start, finished_unix=start + wall)


def test_the_breakdown_adds_up_and_the_gaps_between_trials_are_the_search() -> None:
    trials = [_trial(0, 1000.0, 100.0, 30.0, 60.0, 58.0), _trial(1, 1150.0, 80.0, 25.0, 50.0, 49.0)]
    u = time_use(trials, virtual=False)
    assert u is not None
    assert (u.launches, u.launch_s, u.load_runs_s, u.engine_s) == (2, 55.0, 110.0, 107.0)
    assert u.other_trial_s == 180.0 - 55.0 - 110.0
    assert u.span_s == 230.0 and u.between_trials_s == 50.0  # 1100 -> 1150
    rows = time_use_rows(u)
    assert rows[-1][:3] == ["total", "3.8 min", "100%"]  # 230 s
    assert [r[0] for r in rows[1:-1]] == ["launching servers", "load runs", "scoring, diagnosis, stopping servers",
                                          "between trials: the search itself"]


def test_overlapping_trials_leave_the_time_between_them_unknown() -> None:
    """Two workers ran trials side by side: the span is shorter than the trials' sum, so 'between' is not
    a number the records give."""
    u = time_use([_trial(0, 1000.0, 100.0, 30.0, 60.0), _trial(1, 1010.0, 100.0, 30.0, 60.0)], virtual=False)
    assert u is not None and u.between_trials_s is None and u.span_s is None
    assert "not known" in time_use_rows(u)[-1][3]


def test_a_study_from_before_the_breakdown_has_none() -> None:
    assert time_use([_trial(0, 1000.0, 100.0, 0.0, 0.0)], virtual=False) is None
    assert time_use([], virtual=True) is None


def test_trials_side_by_side_show_each_device_sets_busy_and_idle_time() -> None:
    """Issue 59: two sets over a 300 s span; set 0 ran two trials (100 + 80 s), set 1 one (150 s)."""
    def on(t: TrialView, name: str) -> TrialView:
        return t.model_copy(update={"record": t.record.model_copy(update={"device_set": name})})

    trials = [on(_trial(0, 1000.0, 100.0, 30.0, 60.0), "0"), on(_trial(1, 1120.0, 150.0, 30.0, 100.0), "1"),
              on(_trial(2, 1220.0, 80.0, 20.0, 50.0), "0")]
    u = time_use(trials, virtual=False)
    assert u is not None
    assert [(s.device_set, s.trials, s.busy_s, s.idle_s) for s in u.sets] == [("0", 2, 180.0, 120.0),
                                                                              ("1", 1, 150.0, 150.0)]
    assert set_use_rows(u)[1] == ["0", "2", "3.0 min", "2.0 min", "60%"]
    # one set (or none recorded): no table
    assert time_use([on(t, "0") for t in trials], virtual=False).sets == []
