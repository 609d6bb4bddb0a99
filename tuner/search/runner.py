"""One trial: launch a configuration, find its capacity, diagnose it, stop it, record everything.

The strategies decide *which* knobs to try; this module is the only one that launches and measures, and
it writes every trial into the Optuna study (params, value = capacity, user attribute `record` = the
`TrialRecord`), so a crashed or interrupted study resumes from storage: a configuration already measured
is read back, never re-launched.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import optuna

from tuner import signals
from tuner.search import ahead
from tuner.diagnose import diagnose, why_none_with
from tuner.engine.base import Engine
from tuner.failures import LaunchFailure
from tuner.knobs import Knobs, fixing
from tuner.capacity.knee import KneeSearch, KneeSettings
from tuner.capacity.knee_model import KneeResult
from tuner.search.lessons import Lessons, learn
from tuner.capacity.measure import LoadSettings, latency_quantiles, measure
from tuner.capacity.paired import capacity as paired_capacity
from tuner.capacity.windows import WindowPlan, measure_windows
from tuner.quality import QualityCheck
from tuner.storage.quality import load_reference, save_reference
from tuner.storage.optuna_study import (DEVICE_SET, EXTRA_KNOBS, TrialState, ask, ask_new, enqueue,
                                        finished_records, heartbeats, interrupt, split_knobs, start_trial, tell,
                                        trial_knobs)
from tuner.storage.records import Diagnosis, LearnedConstraint, LoadRunSummary, TrialRecord, WindowCapacity
from tuner.search.space import SearchSpace
from tuner.slo import SLO
from tuner.workload.model import Workload

class Reporter(Protocol):
    def trial_started(self, number: int, knobs: Knobs, role: str) -> None: ...
    def point(self, number: int, point: LoadRunSummary) -> None: ...
    def trial_done(self, record: TrialRecord) -> None: ...
    def incumbent_changed(self, record: TrialRecord) -> None:
        """The strategy stands on `record` now (a confirmed candidate, not every trial that beat the
        incumbent once)."""


class NullReporter:
    def trial_started(self, number, knobs, role): pass
    def point(self, number, point): pass
    def trial_done(self, record): pass
    def incumbent_changed(self, record): pass


def judged(rec: TrialRecord, accept_above: float | None,
           accept: Callable[[TrialRecord], bool] | None) -> bool:
    """Whether a measured trial becomes the incumbent: a capacity, not raced out, above `accept_above` (None:
    any capacity) or accepted by `accept(rec)` (the strategy's rule). Apart from the measuring, so a trial
    measured ahead on another device set is judged by the same rule when the strategy asks for it."""
    cap = rec.capacity_rps
    return bool(cap) and not rec.raced_out and (
        accept_above is None or cap > accept_above or bool(accept and accept(rec)))  # type: ignore[operator]


def counts_as_launch(rec: TrialRecord) -> bool:
    """A stored trial that spent a launch: it came up, or a launch was tried and failed (a configuration
    refused by the space's constraints, or by what failed launches taught, never launched)."""
    return not rec.interrupted and (rec.launched or
                                    rec.launch_failure_kind not in (None, "bad_flag", "ruled_out"))


@dataclass
class TrialRunner:
    study: optuna.Study
    engine: Engine
    workload: Workload
    slo: SLO
    space: SearchSpace
    load: LoadSettings
    knee: KneeSettings
    defaults: dict[str, Any] = field(default_factory=dict)   # vLLM's resolved defaults, when known
    reporter: Reporter = field(default_factory=NullReporter)
    start_rate: float = 1.0
    engine_s: float = 0.0
    compare_rate: float | None = None  # the baseline's capacity: accepted trials also run there once
    current: optuna.Trial | None = None  # the trial asked and not yet told (see `abandon`)
    #: Trials that count against the budget: launched (or tried to) in this process, or stored launches
    #: already accounted for (read back by the strategy, or all of them: `account_stored`).
    counted: set[int] = field(default_factory=set)
    #: Evaluations of each configuration in this process (read back or launched): the n-th evaluation of
    #: a configuration is its n-th launch, so a resumed study reuses every stored launch in order.
    served: Counter = field(default_factory=Counter)
    #: the study's quality check (`tuner.quality`); None: nothing in the study changes an output
    quality: QualityCheck | None = None
    #: interrupted paired launches whose finished windows a later launch of this process carries
    salvaged: set[int] = field(default_factory=set)
    #: the device set this process runs its trials on ('0,1', written on each record); None: the host
    device_set: str | None = None
    #: workers on other device sets of this host run what `prefetch` queues (`tuner.search.pool`); and
    #: whether the worker of a set still runs (a trial it holds will be told)
    helpers: int = 0
    helper_alive: Callable[[str], bool] = lambda name: True

    @property
    def launches(self) -> int:
        """Launches the budget counts (see `counted`)."""
        return len(self.counted)

    # -- storage ----------------------------------------------------------------------------------
    def finished_all(self) -> dict[str, list[TrialRecord]]:
        """Records of trials that ended (complete, raced out, failed to launch), by knobs, each
        configuration's launches in trial order (the baseline and its confirmation are two)."""
        out: dict[str, list[TrialRecord]] = {}
        for r in finished_records(self.study):
            out.setdefault(r.config.key(), []).append(r)
        return out

    def _incumbent_points(self, race_rate: float | None) -> list[LoadRunSummary]:
        """The load runs of the trial whose capacity a candidate races (its curve's shape: `knee_fit`)."""
        if race_rate is None:
            return []
        for r in reversed(finished_records(self.study)):
            if r.capacity_rps and abs(r.capacity_rps / race_rate - 1) < 1e-9:
                return list(r.load_runs)
        return []

    def finished(self) -> dict[str, TrialRecord]:
        """The first finished record of each configuration, by knobs."""
        return {k: v[0] for k, v in self.finished_all().items()}

    def lessons(self) -> Lessons:
        """What the study's failed launches taught about this host (`tuner.search.lessons`), read from
        storage: a resumed study, and every worker of a shared one, knows what the others learned."""
        return Lessons.from_records(r for recs in self.finished_all().values() for r in recs)

    def seen(self, knobs: Knobs) -> bool:
        """Whether this process evaluated `knobs` already (a stored launch not yet read back is not seen:
        a resumed strategy reads it back where the first run measured it)."""
        return self.served[self.space.layout(knobs).key()] > 0

    def account_stored(self) -> int:
        """Count every stored launch against the budget now (strategies that do not replay their
        decisions from storage: grid, tpe, random). Returns the launches counted."""
        for recs in self.finished_all().values():
            for r in recs:
                if counts_as_launch(r) and r.role != "paired":  # the paired check is beyond --max-trials
                    self.counted.add(r.number)
        return self.launches

    def choices(self, knob: str) -> list[Any]:
        """A knob's Optuna choices: None (vLLM's default) and the space's values, each once."""
        out: list[Any] = [None]
        for v in self.space.knobs[knob].values:
            if v not in out:
                out.append(v)
        return out

    def all_choices(self) -> dict[str, list[Any]]:
        return {k: self.choices(k) for k in self.space.knobs}

    # -- one trial --------------------------------------------------------------------------------
    def evaluate(self, knobs: Knobs, *, role: str = "candidate", changed_knob: str | None = None,
                 race_rate: float | None = None, start_rate: float | None = None,
                 incumbent: float | None = None, accept_above: float | None = None,
                 accept: Callable[[TrialRecord], bool] | None = None, fresh: bool = False,
                 windows: WindowPlan | None = None,
                 enough: Callable[[list[WindowCapacity]], bool] | None = None) -> TrialRecord:
        """Measure `knobs` (or read back the stored result of an earlier identical trial, unless `fresh`:
        a second launch of the same configuration). The trial
        becomes the incumbent (`accepted`) when its capacity beats `accept_above` (None: any capacity),
        or when `accept(record)` says so. The space's `layout` fills the host first. With `windows`, the
        launch measures the study's common windows instead of a knee search (role `paired`; a stored
        paired trial of the configuration is read back, and only such a trial; `enough` may end its windows
        early: `tuner.capacity.windows.measure_windows`)."""
        knobs = self.space.layout(knobs)
        key = knobs.key()
        stored = [r for r in self.finished_all().get(key, []) if (r.role == "paired") == (windows is not None)]
        if windows is not None:
            key, role = key + "#paired", "paired"
        nth = self.served[key] if fresh else 0
        if self.helpers and windows is None and nth == len(stored) == 0 and \
                any(k == key for k, _ in ahead.pending(self)):
            # queued ahead for a worker (`prefetch`): run here if none took it yet, else wait for its record
            claimed = ahead.claim_or_wait(self, key)
            if claimed is not None:
                self.served[key] = 1
                return self.run_trial(claimed, role=role, changed_knob=changed_knob, race_rate=race_rate,
                                      start_rate=start_rate, incumbent=incumbent, accept_above=accept_above,
                                      accept=accept)
            stored = [r for r in self.finished_all().get(key, []) if r.role != "paired"]
        if nth < len(stored):  # measured before (by this process, or before an interruption): reused
            done = stored[nth]
            self.served[key] = max(self.served[key], nth + 1)
            if counts_as_launch(done):
                self.counted.add(done.number)
            if done.prefetched:  # measured ahead, with no incumbent to judge it by: judged now
                done = done.model_copy(update={
                    "role": role, "changed_knob": changed_knob, "incumbent_before": incumbent,
                    "accepted": judged(done, accept_above, accept)})
            return done
        self.served[key] = nth + 1
        # knobs outside the space (or values it does not list) travel as a user attribute
        params, extra = split_knobs(knobs, {k: self.choices(k) for k in self.space.knobs})
        signals.check()
        with signals.deferred():  # the trial exists from here: a Ctrl-C must find it in `current`
            # the role travels with the trial, so a trial a killed tool left RUNNING is recorded in it
            if self.helpers:  # workers pop the queue: this trial is made running here, not queued
                trial = self.current = start_trial(self.study, params, {EXTRA_KNOBS: extra, "role": role},
                                                   self.all_choices())
            else:
                enqueue(self.study, params, {EXTRA_KNOBS: extra, "role": role})
                trial = self.ask()
        return self.run_trial(trial, role=role, changed_knob=changed_knob, race_rate=race_rate,
                              start_rate=start_rate, incumbent=incumbent, accept_above=accept_above,
                              accept=accept, windows=windows, enough=enough)

    # -- trials measured ahead on other device sets (`tuner.search.ahead`) ---------------------------
    def prefetch(self, configs: list[tuple[Knobs, float | None]]) -> int:
        """Queue configurations a strategy expects to ask for next, for the other sets' workers."""
        return ahead.prefetch(self, configs)

    def in_flight(self) -> int:
        """Configurations queued ahead or being measured by a worker now."""
        return len(ahead.pending(self))

    def cancel_prefetched(self) -> int:
        """Record every queued-ahead trial still waiting as interrupted (the end of a study)."""
        return ahead.cancel(self)

    def ask(self, choices: dict[str, list[Any]] | None = None, *, sample: bool = False) -> optuna.Trial:
        """The next trial (`tuner.storage.optuna_study.ask`; `choices` default: the space's), remembered as
        the trial under way until it is told (see `abandon`). `sample`: a new trial for the sampler, never
        a queued one (`ask_new`: queued trials are the workers')."""
        with signals.deferred():
            self.current = (ask_new(self.study) if sample else
                            ask(self.study, self.all_choices() if choices is None else choices))
        return self.current

    def abandon(self) -> bool:
        """After a Ctrl-C: the trial under way, if its record was not written, is marked interrupted (a
        signal can land between `ask` and the trial's own clean-up). True when one was marked."""
        trial, self.current = self.current, None
        return trial is not None and interrupt(self.study, trial)

    def run_trial(self, trial: optuna.Trial, *, role: str, **kw: Any) -> TrialRecord:
        """Run `trial` (see `_run_trial`), sending heartbeats meanwhile where the storage wants them."""
        self.current = trial
        signals.check()
        with heartbeats(self.study, trial):
            return self._run_trial(trial, role=role, **kw)

    def _run_trial(self, trial: optuna.Trial, *, role: str, changed_knob: str | None = None,
                   race_rate: float | None = None, start_rate: float | None = None,
                   incumbent: float | None = None, accept_above: float | None = None,
                  accept: Callable[[TrialRecord], bool] | None = None,
                  windows: WindowPlan | None = None,
                  enough: Callable[[list[WindowCapacity]], bool] | None = None,
                  prefetched: bool = False) -> TrialRecord:
        knobs = self.space.layout(trial_knobs({k: trial.params.get(k) for k in self.space.knobs}, trial.user_attrs))
        rec = TrialRecord(number=trial.number, role=role, knobs=knobs, changed_knob=changed_knob,
                          incumbent_before=incumbent, prefetched=prefetched, device_set=self.device_set)
        if self.device_set is not None:
            trial.set_user_attr(DEVICE_SET, self.device_set)
        t0 = time.perf_counter()
        self.reporter.trial_started(trial.number, knobs, role)
        if self._refused(rec, knobs):
            return self._tell(trial, rec, TrialState.FAIL, t0)
        server: Any = None
        search: KneeSearch | None = None
        try:
            try:
                self.counted.add(trial.number)
                t_launch = time.perf_counter()
                try:
                    server = self.engine.launch(knobs)
                finally:
                    rec.launch_s = time.perf_counter() - t_launch
            except LaunchFailure as e:
                self._launch_failed(rec, e)
                return self._tell(trial, rec, TrialState.FAIL, t0)
            rec.launched = True
            rec.kv_cache_tokens = server.info.kv_cache_tokens
            rec.max_concurrency = server.info.max_concurrency
            search = KneeSearch(server, self.workload, self.slo, self.load, self.knee,
                                max_num_seqs=knobs.max_num_seqs or self.defaults.get("max_num_seqs"),
                                on_point=lambda p: self.reporter.point(trial.number, p))
            with server:
                if self.check_quality(server, rec):  # over the SLO's quality bound: rejected
                    return self._tell(trial, rec, TrialState.PRUNED, t0)
                if windows is not None:
                    return self._measure_windows(trial, rec, server, windows, start_rate, knobs, t0, enough)
                t_load = time.perf_counter()
                result = search.run(start_rate or self.start_rate, race_rate, self._incumbent_points(race_rate))
                result.finish(search.knee.saturation_rate)
                cap = result.capacity_rps
                rec.accepted = not prefetched and judged(rec.model_copy(update={
                    "capacity_rps": cap, "capacity_low_rps": result.capacity_low_rps, "raced_out": result.raced_out,
                    "load_runs": list(result.points)}), accept_above, accept)
                if rec.accepted and self.compare_rate and not any(
                        abs(p.rate / self.compare_rate - 1) < 0.03 for p in result.points):
                    # the headline compares both configurations at the same offered load
                    m, _ = measure(server, self.workload, self.slo, self.compare_rate, self.load,
                                   seed=self.load.seed, max_num_seqs=search.max_num_seqs, salt=-1)
                    result.points.append(m.summary)  # a point of its knee curve like any other
                rec.load_wall_s = time.perf_counter() - t_load
            signals.check()
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM, wherever it landed in the trial (the server coming up, a load run, the
            # scoring): the server is stopped (the launcher or `with server` did, unless the signal came
            # between the two) and the trial recorded as interrupted, its points so far kept
            with signals.shielded():
                if server is not None:
                    server.stop_interrupted()
                if self.current is trial:  # not told yet (the signal may come as a failure is told)
                    rec.interrupted = True
                    rec.load_runs = search.result.points if search is not None else []
                    self._tell(trial, rec, TrialState.FAIL, t0)
            raise
        return self._tell(trial, rec, self._record_result(rec, result), t0)

    def _refused(self, rec: TrialRecord, knobs: Knobs) -> bool:
        """A configuration not launched: one that breaks the space's constraints, or one a lesson of this
        study rules out (a strategy that samples blindly, tpe, random or grid, may ask for it)."""
        broken = self.space.allows(knobs, self.defaults)
        if broken:
            rec.launch_failure_kind, rec.launch_failure_message = "bad_flag", f"breaks constraint {broken}"
            return True
        lesson = self.lessons().broken_by(knobs, self.defaults)
        if lesson is not None:
            rec.launch_failure_kind, rec.launch_failure_message = "ruled_out", f"ruled out: {lesson.text()}"
            return True
        return False

    def _launch_failed(self, rec: TrialRecord, e: LaunchFailure) -> None:
        """A launch vLLM refused: its kind and message, what the study learns from it, and the knobs that
        answer it as the trial's diagnosis."""
        rec.launch_failure_kind, rec.launch_failure_message = e.kind, e.message
        rec.launch_facts = e.facts
        rec.learned = learn(rec, self.defaults)
        knobs_fixing, directions = fixing(e.kind)
        if knobs_fixing:
            rec.diagnosis = Diagnosis(kind="launch_failure", summary=e.message[:300], evidence={"failure": e.kind},
                                      knobs=knobs_fixing, directions=directions)

    def _record_result(self, rec: TrialRecord, result: KneeResult) -> TrialState:
        """The knee search's result into the record (capacity, failure, diagnosis, latencies); the
        trial's end state."""
        self.engine_s += result.engine_s
        rec.engine_s = result.engine_s
        rec.load_runs = sorted(result.points, key=lambda p: p.rate)
        rec.capacity_rps, rec.capacity_upper_rps = result.capacity_rps, result.upper
        rec.capacity_low_rps, rec.capacity_high_rps = result.capacity_low_rps, result.capacity_high_rps
        rec.no_capacity_reason = result.why_none
        rec.raced_out = result.raced_out
        if result.requests_failed:  # the server fails requests: a failed trial, not a capacity search
            rec.launch_failure_kind, rec.launch_failure_message = "requests_failed", result.requests_failed
        elif result.client_bound:  # the load client measured itself: no capacity of the server's
            rec.launch_failure_kind, rec.launch_failure_message = "client_bound", result.client_bound
        rec.knee_metrics = result.fail_digest or result.pass_digest
        if not result.raced_out:
            passing = next((p for p in rec.load_runs if p.rate == result.capacity), None)
            rec.diagnosis = diagnose(result.fail_summary, rec.knee_metrics, passing)
            rec.no_capacity_reason = why_none_with(rec.no_capacity_reason, rec.diagnosis)
            if result.pass_records:
                rec.latency_at_capacity = latency_quantiles(result.pass_records)
        return TrialState.FAIL if result.requests_failed or result.client_bound else \
            TrialState.PRUNED if result.raced_out else TrialState.COMPLETE

    def _measure_windows(self, trial: optuna.Trial, rec: TrialRecord, server: Any, plan: WindowPlan,
                         start_rate: float | None, knobs: Knobs, t0: float,
                         enough: Callable[[list[WindowCapacity]], bool] | None) -> TrialRecord:
        """A paired trial: the launch's capacity on each common window (`tuner.capacity.windows`); its
        capacity is their geometric mean and its interval (`tuner.capacity.paired`)."""
        t_load = time.perf_counter()  # an interrupt is handled as in any trial (`_run_trial`)
        earlier, rec.windows_from = self._salvage(knobs, plan, enough)
        rec.windows = list(earlier)  # the windows measured below are appended as each finishes
        rest = replace(plan, seeds=tuple(s for s in plan.seeds if s not in {w.seed for w in earlier}))
        _, engine_s = measure_windows(
            server, self.workload, self.slo, self.load, rest, start_rate or self.start_rate, knee=self.knee,
            max_num_seqs=knobs.max_num_seqs or self.defaults.get("max_num_seqs"),
            on_point=lambda p: self.reporter.point(trial.number, p),
            enough=enough, out=rec.windows)
        rec.load_wall_s = time.perf_counter() - t_load
        self.engine_s += engine_s
        rec.engine_s = engine_s
        cap = paired_capacity(rec.windows)
        if cap is not None:
            rec.capacity_rps, rec.capacity_low_rps, rec.capacity_high_rps = cap.rps, cap.low, cap.high
        else:
            rec.no_capacity_reason = "met the SLO at no rate on some of the common request windows"
        return self._tell(trial, rec, TrialState.COMPLETE, t0)

    def _salvage(self, knobs: Knobs, plan: WindowPlan,
                 enough: Callable[[list[WindowCapacity]], bool] | None) -> tuple[list[WindowCapacity], list[int]]:
        """The finished windows of this configuration's interrupted paired launches, on `plan`'s seeds
        (each interrupted launch lends its windows once), and those launches' trial numbers. Nothing
        where they would leave no window to measure, or already decide the comparison: the launch then
        measures the plan as if uninterrupted, so a resumed study answers as an uninterrupted one."""
        key = knobs.key()
        got: dict[int, WindowCapacity] = {}
        trials: list[int] = []
        for t in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            raw = t.user_attrs.get("record")
            if t.number in self.salvaged or raw is None or raw.get("role") != "paired" \
                    or not raw.get("interrupted"):
                continue
            rec = TrialRecord(**raw)
            mine = [w for w in rec.windows if w.seed in plan.seeds and w.seed not in got]
            if rec.config.key() != key or not mine:
                continue
            got.update((w.seed, w) for w in mine)
            trials.append(t.number)
        order = [got[s] for s in plan.seeds if s in got]
        # only a prefix of the plan's order is lent: the windows after it are measured as they would be
        prefix: list[WindowCapacity] = []
        for s, w in zip(plan.seeds, order):
            if w.seed != s:
                break
            prefix.append(w)
        if not prefix or len(prefix) == len(plan.seeds) or (enough is not None and enough(prefix)):
            return [], []
        self.salvaged.update(trials)
        return prefix, trials

    def check_quality(self, server: Any, rec: TrialRecord) -> bool:
        """The launch's quality evidence on `rec` (`tuner.quality`); True when it breaks the SLO's bound:
        the trial then ends like one that breaks a latency threshold at every rate, with the reason, and
        a lone output-changing knob's value is ruled out for the rest of the study."""
        if self.quality is None:
            return False
        rec.quality = self.quality.run(server, rec.knobs, rec.number, load_reference(self.study.user_attrs),
                                       lambda ref: save_reference(self.study, ref))
        why = rec.quality.rejected if rec.quality else None
        if why is None:
            return False
        rec.no_capacity_reason = f"rejected for output quality: {why}"
        changed = self.quality.changed(rec.knobs)
        if len(changed) == 1:
            rec.learned.append(LearnedConstraint(knob=changed[0], rule="not", value=rec.knobs[changed[0]],
                                                 trial=rec.number, failure="quality", message=why))
        return True

    def _tell(self, trial: optuna.Trial, rec: TrialRecord, state: TrialState, t0: float) -> TrialRecord:
        rec.wall_s = time.perf_counter() - t0
        with signals.deferred():  # the record and the trial's state are written together, or not at all
            tell(self.study, trial, rec, state)
            if self.current is trial:
                self.current = None
        self.reporter.trial_done(rec)
        return rec
