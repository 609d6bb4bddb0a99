"""Scale-out on a real PostgreSQL: `tune --strategy grid --storage URL` queues the grid, `tune worker`
processes share it. Every configuration runs exactly once, and a worker killed mid-trial costs nothing: its
trial stops sending heartbeats, is failed as stale and retried by another worker, and the queue drains.

Needs `TUNER_TEST_POSTGRES_URL` (written to .ci/env by .ci/setup-postgres.sh); each test gets a database
of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.conftest import (GPU, MODEL, SIM_HTTP_LOAD, SLO, TUNE_FIX, WORKLOAD, knobs_of, load_trials,  # noqa: F401
                                processes_mentioning,
                                port_is_free, record, server_gone, server_pidfiles, spawn, tune, tune_env,  # noqa: F401 (spawn: a fixture)
                                wait_for)

URL = os.environ.get("TUNER_TEST_POSTGRES_URL")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not URL, reason="no PostgreSQL: TUNER_TEST_POSTGRES_URL is unset (run "
                                       ".ci/setup-postgres.sh, then source .ci/env)"),
]

# Fast heartbeats so a dead worker's trial is found stale in seconds (defaults: 30 s, grace 90 s).
HEARTBEAT_ENV = {"TUNER_HEARTBEAT_S": "1", "TUNER_HEARTBEAT_GRACE_S": "4"}


def _admin():
    """An AUTOCOMMIT engine on the test server (CREATE / DROP DATABASE), or a skip with the reason."""
    import sqlalchemy as sa

    try:
        admin = sa.create_engine(URL, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        with admin.connect() as c:
            c.execute(sa.text("SELECT 1"))
    except Exception as e:  # the server is gone since setup: a skip with the reason, not an error
        pytest.skip(f"PostgreSQL at TUNER_TEST_POSTGRES_URL does not answer: {e.__class__.__name__}: {e}")
    return admin


@contextmanager
def _database(admin, template: str | None = None):
    """A new database (a copy of `template`'s, if given), dropped afterwards; yields (name, url)."""
    import sqlalchemy as sa

    name = f"tuner_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        if template:  # a copy needs the template to itself: close what this process's reads left open
            c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :t AND pid <> pg_backend_pid()"), {"t": template})
        c.execute(sa.text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    try:
        yield name, admin.url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_url():
    """A fresh database for one test (the study name is fixed, so one study per database)."""
    admin = _admin()
    with _database(admin) as (_, url):
        yield url
    admin.dispose()


@pytest.fixture(scope="module")
def queued_one(tmp_path_factory):
    """A database in which a sim-http leader ran its baseline and queued one grid configuration, made once:
    the leader's real-time baseline is half a minute, and the two fault tests below start from the same
    queue. Each copies it (`pg_queued`), so what one test's workers do never reaches the other's."""
    admin = _admin()
    with _database(admin) as (name, url):
        start_leader(tmp_path_factory.mktemp("leader"), url, "sim-http", TUNE_FIX / "space1.yaml", grid=1)
        yield admin, name
    admin.dispose()


@pytest.fixture
def pg_queued(queued_one):
    """A copy of `queued_one`'s database for one test (PostgreSQL's CREATE DATABASE ... TEMPLATE)."""
    admin, template = queued_one
    with _database(admin, template) as (_, url):
        from optuna.trial import TrialState

        assert [t.state for t in load_trials(url)] == [TrialState.COMPLETE, TrialState.WAITING]
        yield url


def leader_args(out: Path, url: str, engine: str, space: Path) -> list[str]:
    """The study's creator: runs the baseline, queues the grid, and (with one launch of budget) leaves the
    queue to the workers."""
    args = ["--workload", WORKLOAD, "--slo", SLO, "--engine", engine, "--gpu", GPU, "--model", MODEL,
            "--strategy", "grid", "--search-space", space, "--storage", url, "--max-trials", "1", "--out", out]
    if engine == "sim-http":
        args += [*SIM_HTTP_LOAD, "--precision", "1.0"]  # a coarse knee: grid trials are not raced
    else:
        args += ["--requests-per-run", "400"]
    return [str(a) for a in args]


def worker_args(out: Path, url: str, idle_exit: float = 3) -> list[str]:
    return ["worker", "--out", str(out), "--storage", url, "--idle-exit", str(idle_exit)]


def trials_done(p) -> int:
    m = re.search(r"worker done: (\d+) trials", p.output() if hasattr(p, "output") else p.stderr)
    assert m, p.output() if hasattr(p, "output") else p.stderr
    return int(m.group(1))


def start_leader(tmp_path: Path, url: str, engine: str, space: Path, grid: int):
    from optuna.trial import TrialState

    lead = tune(*leader_args(tmp_path / "leader", url, engine, space), timeout=180, env=tune_env(**HEARTBEAT_ENV))
    assert lead.returncode == 0, lead.stderr
    trials = load_trials(url)
    assert [t.state for t in trials] == [TrialState.COMPLETE] + [TrialState.WAITING] * grid, \
        [(t.number, t.state) for t in trials]
    assert (tmp_path / "leader" / "storage.txt").read_text().strip() == url
    return trials


def assert_grid_done_once(url: str, grid: int) -> list:
    from optuna.trial import TrialState

    trials = load_trials(url)
    assert not [t for t in trials if t.state in (TrialState.WAITING, TrialState.RUNNING)], \
        [(t.number, t.state) for t in trials]
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    keys = [knobs_of(t) for t in done]
    assert len(set(keys)) == len(keys), f"a configuration ran twice: {sorted(keys)}"
    assert len(keys) == grid + 1, sorted(keys)  # the baseline and every grid configuration
    return trials


def wait_under_load(worker, run_dir: Path) -> dict:
    """The pidfile record of the worker's server once it has been up for 2 s: its trial is in the middle of
    its load runs (`tune worker` prints no progress, so its run directory tells)."""
    seen: dict[int, float] = {}

    def under_load():
        assert worker.poll() is None, worker.output()
        recs = [r for r in server_pidfiles(run_dir) if not port_is_free(r["port"])]
        if len(recs) != 1:
            return None
        first = seen.setdefault(recs[0]["pid"], time.monotonic())
        return recs[0] if time.monotonic() - first > 2.0 else None
    return wait_for(under_load, 120, 0.2, f"the worker's trial in {run_dir} to be under load")


def test_two_workers_share_the_grid_each_configuration_once(tmp_path: Path, pg_url: str, spawn) -> None:
    start_leader(tmp_path, pg_url, "sim", TUNE_FIX / "space_grid8.yaml", grid=8)
    # two hosts: each its own run directory, the database shared
    workers = [spawn(worker_args(tmp_path / f"w{i}", pg_url), tmp_path / f"w{i}.log",
                     env=tune_env(**HEARTBEAT_ENV)) for i in (1, 2)]
    for w in workers:
        assert w.wait(timeout=180) == 0, w.output()
        assert "Traceback" not in w.output()
    assert sum(trials_done(w) for w in workers) == 8, [w.output()[-300:] for w in workers]
    assert_grid_done_once(pg_url, grid=8)


def test_the_queue_drains_when_a_worker_is_killed_mid_trial(tmp_path: Path, pg_queued: str, spawn) -> None:
    """One queued configuration; the worker running it is SIGKILLed mid-trial while a second worker waits.
    The dead worker's trial stops sending heartbeats, is failed as stale, and re-queued; the second worker
    runs it and the queue drains."""
    from optuna.trial import TrialState

    pg_url = pg_queued
    env = tune_env(**HEARTBEAT_ENV)
    victim = spawn(worker_args(tmp_path / "w1", pg_url), tmp_path / "w1.log", env=env)
    srv = wait_under_load(victim, tmp_path / "w1")
    (running,) = [t for t in load_trials(pg_url) if t.state == TrialState.RUNNING]

    survivor = spawn(worker_args(tmp_path / "w2", pg_url), tmp_path / "w2.log", env=env)
    time.sleep(2)  # the second worker is up, finds the queue empty and the trial running: it waits
    assert survivor.poll() is None, survivor.output()
    victim.kill()
    wait_for(lambda: server_gone(srv), 20, what=f"the killed worker's server to go: {srv}")

    assert survivor.wait(timeout=180) == 0, survivor.output()
    assert "Traceback" not in survivor.output()
    assert trials_done(survivor) == 1
    trials = assert_grid_done_once(pg_url, grid=1)
    stale = next(t for t in trials if t.number == running.number)
    assert stale.state == TrialState.FAIL and not record(stale), (stale.state, record(stale))
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retried) == 1 and retried[0].state in (TrialState.COMPLETE, TrialState.PRUNED), retried
    assert knobs_of(retried[0]) == knobs_of(stale) == '{"max_num_seqs": 64}'
    assert record(retried[0])["capacity_rps"] and record(retried[0])["role"] == "grid"
    # measured like the leader's trials: the study's --max-run-s 8 (SIM_HTTP_LOAD), not a worker's
    # default 60 s, bounds every load run's requests
    assert all(run["n"] <= (run["rate"] * 8 + 1) * run["repeats"] for run in record(retried[0])["load_runs"]
               if run["rate"] < 1e5), record(retried[0])["load_runs"]


def test_a_worker_stopped_with_ctrl_c_hands_its_trial_back(tmp_path: Path, pg_queued: str, spawn) -> None:
    """Ctrl-C (or SIGTERM) to a worker: its trial is recorded as interrupted, its configuration queued
    again, and the next worker runs it."""
    from optuna.trial import TrialState

    pg_url = pg_queued
    first = spawn(worker_args(tmp_path / "w1", pg_url), tmp_path / "w1.log", env=tune_env(**HEARTBEAT_ENV))
    srv = wait_for(lambda: first.poll() is None and next(
        (r for r in server_pidfiles(tmp_path / "w1") if not port_is_free(r["port"])), None), 120, 0.2,
        "the worker's server to be up")
    time.sleep(1.0)
    first.ctrl_c()
    assert first.wait(timeout=60) == 130, first.output()
    assert "will be retried" in first.output() and "Traceback" not in first.output()
    assert server_gone(srv)
    trials = load_trials(pg_url)
    (cut,) = [t for t in trials if t.state == TrialState.FAIL]
    assert record(cut)["interrupted"] is True
    (queued,) = [t for t in trials if t.state == TrialState.WAITING]
    assert queued.system_attrs["fixed_params"] == {"max_num_seqs": 64} and queued.user_attrs["role"] == "grid"
    assert knobs_of(cut) == '{"max_num_seqs": 64}'

    second = tune(*worker_args(tmp_path / "w2", pg_url), timeout=120, env=tune_env(**HEARTBEAT_ENV))
    assert second.returncode == 0 and trials_done(second) == 1, second.stderr
    assert_grid_done_once(pg_url, grid=1)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores to make two sets")
def test_two_workers_with_two_device_sets_each_share_the_grid_once(tmp_path: Path, pg_url: str, spawn) -> None:
    """Issue 59: each worker host runs one trial per device set (here two sets of one core each, per worker):
    four trials side by side on one study, every configuration once, each record saying its set."""
    start_leader(tmp_path, pg_url, "sim", TUNE_FIX / "space_grid8.yaml", grid=8)
    sets = ["--device-kind", "cpu", "--devices", "0-1", "--set-size", "1"]
    workers = [spawn([*worker_args(tmp_path / f"w{i}", pg_url), *sets], tmp_path / f"w{i}.log",
                     env=tune_env(**HEARTBEAT_ENV)) for i in (1, 2)]
    for w in workers:
        assert w.wait(timeout=300) == 0, w.output()
        assert "Traceback" not in w.output()
    trials = assert_grid_done_once(pg_url, grid=8)
    used = {record(t).get("device_set") for t in trials if record(t).get("role") == "grid"}
    assert used == {"0", "1"}, used
    # no set's worker outlived its host's worker
    assert not processes_mentioning("tuner.cli", "worker", "--device-set")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPU cores to make two sets")
def test_a_host_with_two_device_sets_lost_mid_trial_loses_nothing(tmp_path: Path, pg_queued: str, spawn) -> None:
    """Issue 59, Must show 4: a worker host with two device sets is lost whole (SIGKILL to its process group:
    the host's worker and its sets' workers) while one of its sets runs the queued trial. A second host, also
    with two sets, finds that trial stale, re-runs it on one of its sets, and nothing runs twice."""
    from optuna.trial import TrialState

    pg_url = pg_queued
    env = tune_env(**HEARTBEAT_ENV)
    sets = ["--device-kind", "cpu", "--devices", "0-1", "--set-size", "1"]
    victim = spawn([*worker_args(tmp_path / "w1", pg_url), *sets], tmp_path / "w1.log", env=env)
    srv = wait_under_load(victim, tmp_path / "w1")
    (running,) = [t for t in load_trials(pg_url) if t.state == TrialState.RUNNING]
    assert running.user_attrs.get("device_set") in ("0", "1"), running.user_attrs
    set_workers = processes_mentioning("tuner.cli", "--device-set", str(tmp_path / "w1"))
    assert set_workers, "the first host runs its trials in its sets' workers"

    survivor = spawn([*worker_args(tmp_path / "w2", pg_url), *sets], tmp_path / "w2.log", env=env)
    time.sleep(2)  # the second host is up, finds the queue empty and the trial running: it waits
    assert survivor.poll() is None, survivor.output()
    os.killpg(victim.pid, signal.SIGKILL)  # the host is lost: no worker of it can hand anything back
    victim.popen.wait()
    wait_for(lambda: server_gone(srv), 20, what=f"the lost host's server to go: {srv}")
    wait_for(lambda: not processes_mentioning("tuner.cli", "--device-set", str(tmp_path / "w1")), 10,
             what="the lost host's set workers to go")

    assert survivor.wait(timeout=240) == 0, survivor.output()
    assert "Traceback" not in survivor.output()
    trials = assert_grid_done_once(pg_url, grid=1)
    stale = next(t for t in trials if t.number == running.number)
    assert stale.state == TrialState.FAIL and not record(stale), (stale.state, record(stale))
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == stale.number]
    assert len(retried) == 1 and retried[0].state in (TrialState.COMPLETE, TrialState.PRUNED), retried
    assert knobs_of(retried[0]) == knobs_of(stale) == '{"max_num_seqs": 64}'
    assert record(retried[0])["capacity_rps"] and record(retried[0])["device_set"] in ("0", "1")
    assert not processes_mentioning("tuner.cli", "worker", "--device-set")


def test_worker_job_exports_pods_without_the_database_url(tmp_path: Path, pg_url: str) -> None:
    start_leader(tmp_path, pg_url, "sim", TUNE_FIX / "space_grid8.yaml", grid=8)
    p = tune("worker-job", "--out", tmp_path / "leader", "--image", "registry/slo-tuner:1", "--pods", "4",
             timeout=60)
    assert p.returncode == 0, p.stderr
    import yaml

    job = yaml.safe_load(p.stdout)
    assert job["kind"] == "Job" and job["spec"]["parallelism"] == 4
    assert pg_url not in p.stdout and "postgresql" not in p.stdout
