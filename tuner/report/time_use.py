"""Where a study's time went: launching servers, driving load runs, and the rest.

Why: on a real engine the cost of a study is engine time (on a GPU every second of a load run is a GPU
second, and every launch is minutes of loading weights), and a user deciding whether to spend another
hour wants to see which part to cut: fewer launches, shorter runs (`--max-run-s`), or the search's own
work between trials (the twin's fits and ranking). Everything here is read from the trials' own records
(`TrialRecord.launch_s`, `load_wall_s`, `wall_s`, `engine_s`) and Optuna's trial times; nothing is
estimated. A study stored before these were recorded has no breakdown, and the report says nothing.
"""

from __future__ import annotations

from pydantic import BaseModel

from tuner.storage.reader import TrialView


class SetUse(BaseModel):
    """One device set's share of a study that ran trials side by side."""

    device_set: str
    trials: int
    busy_s: float
    idle_s: float


def set_use(done: list[TrialView]) -> list[SetUse]:
    """Busy and idle seconds per device set, where trials ran on more than one."""
    names = sorted({t.record.device_set for t in done if t.record.device_set is not None})
    starts = [t.started_unix for t in done if t.started_unix is not None]
    ends = [t.finished_unix for t in done if t.finished_unix is not None]
    if len(names) < 2 or not starts or not ends:
        return []
    span = max(ends) - min(starts)
    out = []
    for name in names:
        mine = [t for t in done if t.record.device_set == name]
        busy = sum(t.record.wall_s for t in mine)
        out.append(SetUse(device_set=name, trials=len(mine), busy_s=busy, idle_s=max(0.0, span - busy)))
    return out


class TimeUse(BaseModel):
    """Wall seconds of a study by what they were spent on (engine seconds beside the load runs')."""

    trials: int
    launches: int                       # launch attempts (a refused launch took time too)
    launch_s: float                     # waiting for servers to come up or to fail
    load_runs_s: float                  # driving load runs, the prefix warm-up included (wall time)
    engine_s: float                     # the engine's seconds in those runs (virtual time on the simulator)
    other_trial_s: float                # the rest of the trials: scoring, diagnosis, stopping servers
    #: From the first trial's start to the last one's end, less the trials: the search's own work (the
    #: twin's fits and ranking, Optuna). None where trials overlapped (several workers) or times are missing.
    between_trials_s: float | None = None
    span_s: float | None = None
    virtual: bool = False
    #: trials side by side (`--devices`): each device set's trials and busy seconds, its idle the rest
    #: of the study's span (from the first trial's start to the last one's end); empty: one set or none
    sets: list[SetUse] = []


def time_use(trials: list[TrialView], virtual: bool) -> TimeUse | None:
    """The breakdown, or None when no trial recorded where its time went (a study from before)."""
    done = [t for t in trials if t.record.wall_s > 0]
    if not done or not any(t.record.launch_s > 0 for t in done):
        return None
    launch = sum(t.record.launch_s for t in done)
    load = sum(t.record.load_wall_s for t in done)
    wall = sum(t.record.wall_s for t in done)
    starts = [t.started_unix for t in done if t.started_unix is not None]
    ends = [t.finished_unix for t in done if t.finished_unix is not None]
    span = (max(ends) - min(starts)) if starts and ends and len(starts) == len(ends) == len(done) else None
    between = span - wall if span is not None and span >= wall else None
    return TimeUse(trials=len(done), launches=sum(1 for t in done if t.record.launch_s > 0), launch_s=launch,
                   load_runs_s=load, engine_s=sum(t.record.engine_s for t in done),
                   other_trial_s=max(0.0, wall - launch - load), between_trials_s=between,
                   span_s=span if between is not None else None, virtual=virtual, sets=set_use(done))


def _s(x: float) -> str:
    return f"{x / 60:.1f} min" if x >= 120 else f"{x:.1f} s"


def time_use_rows(u: TimeUse) -> list[list[str]]:
    """The report's table: one row per use of time, with its share of the total measured."""
    engine = (f"engine time {_s(u.engine_s)}, virtual: the simulator ran it in the wall time shown" if u.virtual
              else f"engine time {_s(u.engine_s)}")
    parts = [("launching servers", u.launch_s, f"{u.launches} launches, {_s(u.launch_s / u.launches)} each"),
             ("load runs", u.load_runs_s, engine),
             ("scoring, diagnosis, stopping servers", u.other_trial_s, "")]
    if u.between_trials_s is not None:
        parts.append(("between trials: the search itself", u.between_trials_s,
                      "choosing the next configuration (the twin's fits and ranking, Optuna)"))
    total = sum(p[1] for p in parts) or 1.0
    rows = [["what", "wall time", "share", "detail"]]
    rows += [[name, _s(s), f"{100 * s / total:.0f}%", detail] for name, s, detail in parts]
    rows.append(["total", _s(total), "100%", f"{u.trials} trials"
                 + ("" if u.between_trials_s is not None else "; time between trials not known (overlapping "
                                                              "trials or a study from before)")])
    return rows


def set_use_rows(u: TimeUse) -> list[list[str]]:
    """The report's table of device sets: each one's trials, busy and idle time over the study's span."""
    rows = [["device set", "trials", "busy", "idle", "busy share"]]
    for s in u.sets:
        whole = s.busy_s + s.idle_s
        rows.append([s.device_set, str(s.trials), _s(s.busy_s), _s(s.idle_s),
                     f"{100 * s.busy_s / whole:.0f}%" if whole else "-"])
    return rows
