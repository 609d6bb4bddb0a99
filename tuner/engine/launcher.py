"""Start, watch and stop one server subprocess so that no trial can be spoiled by the one before it.

Every subprocess engine (real `vllm serve`, the HTTP simulator, a user's wrapper command) goes through
here, because the failure modes are the same and each one silently corrupts a tuning study:

- A server outliving the tool (tool SIGKILLed, CI timeout) keeps its port and GPU memory, so the *next*
  trial fails with "Free memory on device ... less than desired" and the search learns a false lesson.
  Hence: a new session and process group per server (one signal reaches vLLM's engine-core and worker
  children too), `PR_SET_PDEATHSIG=SIGKILL` in the direct child (the server is exec'd directly, no shell in
  between, so the kernel kills it when the tool dies), and a pidfile `server.pid` that `reap_stale` uses
  on `--resume` to find what a killed tool left behind.
- pdeathsig reaches only the direct child, and vLLM's engine core and workers outlive a SIGKILLed API
  server; so each server also gets a watchdog process (`tuner.engine.watchdog`) that kills the whole group
  when the tool's end of a pipe closes, i.e. when the tool dies by any means.
- "Stopped" must mean released: after SIGTERM, then SIGKILL, to the whole group, `stop` waits until the
  port can be bound again and, where `nvidia-smi` exists, until the GPU no longer lists the group's pids.
- A launch that dies must say why: we fail fast when the process exits before `/health` answers 200 and
  classify its log (`tuner.engine.classify`), so a bad configuration is told apart from a broken one.

The API key never appears on a command line (visible in `ps` and the pidfile); callers pass it in `env`.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Mapping, Sequence

import httpx

import tuner
from tuner import signals
from tuner.engine import procs
from tuner.engine.base import LaunchInfo
from tuner.engine.ports import free_port, port_is_free, wait_port_free  # noqa: F401  (callers pick a port through the launcher)
from tuner.engine.classify import classified_failure, classify_failure, parse_launch_info
from tuner.errors import UserError

log = logging.getLogger(__name__)

PIDFILE = "server.pid"
TOKEN_ENV = "TUNER_LAUNCH_TOKEN"
#: After a Ctrl-C or SIGTERM the server group gets this long to exit on SIGTERM before SIGKILL (a normal
#: stop between trials waits longer: vLLM frees its GPU memory on a graceful exit). vLLM ignores SIGTERM
#: while it loads weights and compiles, so a long wait here only delays the tool's exit.
INTERRUPT_TERM_S = 3.0
#: ... and this long for SIGKILL, the port and the GPU memory.
INTERRUPT_RELEASE_S = 5.0
_PR_SET_PDEATHSIG = 1


def pdeathsig_preexec(sig: int = signal.SIGKILL):
    """A preexec_fn that makes the kernel send `sig` to the child when its parent dies.

    libc is resolved here, before fork, so the child runs no imports. If the parent already died between
    fork and prctl the signal would never come, so the child checks and kills itself.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no pdeathsig, the pidfile still allows reaping
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class _Spawner:
    """Runs every Popen on one thread that lives as long as the process.

    PDEATHSIG fires when the *thread* that forked the child exits, not the process. A study that launches
    from a worker thread (a thread pool, a timeout helper) would see its server SIGKILLed when that thread
    ends. The main thread forks directly; other threads hand the fork to this long-lived daemon thread.
    """

    _lock = threading.Lock()
    _queue: "queue.Queue | None" = None

    @classmethod
    def popen(cls, argv: list[str], **kwargs) -> subprocess.Popen:
        if threading.current_thread() is threading.main_thread():
            return subprocess.Popen(argv, **kwargs)
        with cls._lock:
            if cls._queue is None:
                cls._queue = queue.Queue()
                threading.Thread(target=cls._serve, args=(cls._queue,), name="tuner-spawner",
                                 daemon=True).start()
        reply: queue.Queue = queue.Queue(maxsize=1)
        cls._queue.put((argv, kwargs, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    @staticmethod
    def _serve(q: "queue.Queue") -> None:
        while True:
            argv, kwargs, reply = q.get()
            try:
                reply.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as e:  # handed back to the caller's thread
                reply.put((False, e))


_live: "set[ManagedProcess]" = set()


def stop_all(*, interrupted: bool = True) -> int:
    """Stop every server this process started and has not stopped yet (an interrupt's clean-up: with
    `interrupted`, on the short SIGTERM grace `INTERRUPT_TERM_S`). Returns how many were running."""
    live = list(_live)
    for proc in live:
        try:
            if interrupted:
                proc.stop_interrupted()
            else:
                proc.stop(term_timeout_s=5, kill_timeout_s=5, release_timeout_s=5)
        except Exception:  # best effort: the next one must still be stopped
            log.exception("stopping server group %d failed", proc.pgid)
    return len(live)


@atexit.register
def _stop_leftovers() -> None:
    """A normal interpreter exit (even after an unhandled error) never leaves a server behind."""
    stop_all(interrupted=False)


class ManagedProcess:
    """One running server process group, its log, its pidfile."""

    def __init__(self, popen: subprocess.Popen, *, argv: Sequence[str], host: str, port: int,
                 run_dir: Path, log_path: Path, token: str):
        self.popen = popen
        self.watchdog: subprocess.Popen | None = None
        self._watch_fd: int | None = None
        self.argv = list(argv)
        self.pid = popen.pid
        self.pgid = popen.pid  # process_group=0: the child leads its own process group
        self.host = host
        self.port = port
        self.run_dir = run_dir
        self.log_path = log_path
        self.token = token
        self.started = time.monotonic()
        self.stopped = False
        self.pidfile = run_dir / PIDFILE
        self._write_pidfile()
        _live.add(self)
        self._start_watchdog()

    def _start_watchdog(self) -> None:
        """See `tuner.engine.watchdog`. Without one (spawn failed) pdeathsig and the pidfile remain."""
        r, w = os.pipe()  # both non-inheritable: no other child of the tool keeps the write end open
        pkg_root = str(Path(tuner.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))}
        try:
            with open(self.log_path, "ab") as logf:
                self.watchdog = _Spawner.popen(
                    [sys.executable, "-m", "tuner.engine.watchdog", str(r), str(self.pgid), TOKEN_ENV,
                     self.token, str(self.pidfile)],
                    pass_fds=(r,), start_new_session=True, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=logf, env=env, close_fds=True)
            self._watch_fd = w
        except OSError as e:
            log.warning("no watchdog for server %d (%s); relying on pdeathsig and the pidfile", self.pid, e)
            os.close(w)
        finally:
            os.close(r)

    def _release_watchdog(self) -> None:
        if self._watch_fd is not None:
            os.close(self._watch_fd)
            self._watch_fd = None
        if self.watchdog is not None:
            try:
                self.watchdog.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _write_pidfile(self) -> None:
        """Record what `reap_stale` needs. Rewritten once healthy, when vLLM has forked its engine core
        and workers: their (pid, start ticks) prove the group is ours after the leader is gone."""
        record = {"pid": self.pid, "pgid": self.pgid, "port": self.port, "host": self.host,
                  "token": self.token, "members": procs.snapshot(dict.fromkeys([self.pid, *self.members()])),
                  "log": str(self.log_path), "argv0": self.argv[0] if self.argv else ""}
        tmp = self.pidfile.with_suffix(".tmp")
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(self.pidfile)

    def poll(self) -> int | None:
        return self.popen.poll()

    def members(self) -> list[int]:
        """Live (non-zombie) pids of the server's process group."""
        return procs.group_members(self.pgid)

    def read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_healthy(self, timeout_s: float, *, health_path: str = "/health",
                     headers: Mapping[str, str] | None = None, interval_s: float = 0.25) -> float:
        """Poll `GET health_path` until 200; return seconds since start.

        Raises `LaunchFailure` (classified from the log) as soon as the process exits, or kind `timeout`.
        The caller stops the process on failure.
        """
        deadline = self.started + timeout_s
        url = self.base_url + health_path
        with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0), headers=dict(headers or {})) as client:
            while True:
                rc = self.poll()
                if rc is not None:
                    kind, message = classify_failure(self.read_log(), returncode=rc)
                    raise classified_failure(kind, message, _tail(self.read_log()))
                try:
                    if client.get(url).status_code == 200:
                        self._write_pidfile()
                        return time.monotonic() - self.started
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    kind, message = classify_failure(self.read_log(), timed_out=True, timeout_s=timeout_s)
                    raise classified_failure(kind, message, _tail(self.read_log()))
                time.sleep(interval_s)

    def stop(self, *, term_timeout_s: float = 30.0, kill_timeout_s: float = 10.0,
             release_timeout_s: float = 60.0) -> None:
        """SIGTERM the group, wait, SIGKILL it, then wait until the port and GPU memory are released.

        Idempotent. A Ctrl-C while stopping still SIGKILLs the group before it propagates.
        """
        if self.stopped:
            return
        seen = set(self.members()) | {self.pid}
        try:
            procs.signal_group(self.pgid, signal.SIGTERM)
            if not self._wait_gone(term_timeout_s, seen):
                log.warning("server group %d ignored SIGTERM for %.0f s; sending SIGKILL", self.pgid,
                            term_timeout_s)
                procs.signal_group(self.pgid, signal.SIGKILL)
                if not self._wait_gone(kill_timeout_s, seen):
                    log.error("server group %d still has processes after SIGKILL: %s", self.pgid,
                              self.members())
        except BaseException:
            procs.signal_group(self.pgid, signal.SIGKILL)
            self._reap()
            raise
        finally:
            self._reap()
        if not wait_port_free(self.host, self.port, release_timeout_s):
            log.warning("port %d still busy %.0f s after the server stopped", self.port, release_timeout_s)
        if not procs.wait_gpu_released(seen, release_timeout_s):
            log.warning("GPU memory of pids %s not released after %.0f s", sorted(seen), release_timeout_s)
        self.stopped = True
        _live.discard(self)
        self._release_watchdog()
        self.pidfile.unlink(missing_ok=True)

    def stop_interrupted(self) -> None:
        """`stop` after a Ctrl-C or SIGTERM: a short SIGTERM grace, then SIGKILL; bounded in time."""
        self.stop(term_timeout_s=INTERRUPT_TERM_S, kill_timeout_s=INTERRUPT_RELEASE_S,
                  release_timeout_s=INTERRUPT_RELEASE_S)

    def _wait_gone(self, timeout_s: float, seen: set[int]) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reap()
            live = self.members()
            seen.update(live)
            if not live:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _reap(self) -> None:
        try:
            self.popen.wait(timeout=0)
        except subprocess.TimeoutExpired:
            pass


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def start_process(argv: Sequence[str], *, run_dir: str | Path, port: int, host: str = "127.0.0.1",
                  env: Mapping[str, str] | None = None, log_name: str = "server.log",
                  cwd: str | Path | None = None) -> ManagedProcess:
    """Exec `argv` as a new process group with pdeathsig, stdout+stderr to `run_dir/log_name`; write the
    pidfile.

    A process group, not a session: the group is what `stop` signals (and what keeps a terminal's Ctrl-C
    away from the server), while staying in the tool's session keeps the server in the tool's scheduling
    group. Linux's autogroup scheduler (`kernel.sched_autogroup_enabled`, on by default) shares the CPU
    between sessions by their recent load: a server launched as its own session, whose engine threads
    busy-poll, left the load client (mostly asleep, so a light group) waiting ~10 ms on the run queue at
    every wake-up. On a 2-core host that made the client read whole responses long after the server
    streamed them: mean TTFT 300-600 ms where vLLM's own histogram said 10 ms (docs/measurement.md,
    "Who gets the CPU").

    `env` is added to this process's environment. Raises `UserError` when the program does not exist.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / log_name
    token = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}

    # a Ctrl-C between the fork and the pidfile would leave a server nobody tracks: it waits until then
    with signals.deferred(), open(log_path, "ab") as logf:
        try:
            popen = _Spawner.popen(list(argv), stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                   env=full_env, cwd=cwd, process_group=0,
                                   preexec_fn=pdeathsig_preexec(), close_fds=True)
        except FileNotFoundError as e:
            raise UserError(f"cannot run {argv[0]!r}: not found ({e.strerror})", field="command") from e
        except PermissionError as e:
            raise UserError(f"cannot run {argv[0]!r}: {e.strerror}", field="command") from e
        proc = ManagedProcess(popen, argv=argv, host=host, port=port, run_dir=run_dir, log_path=log_path,
                              token=token)
    return proc


def launch(argv: Sequence[str], *, run_dir: str | Path, port: int, host: str = "127.0.0.1",
           env: Mapping[str, str] | None = None, startup_timeout_s: float = 600.0,
           health_path: str = "/health", headers: Mapping[str, str] | None = None,
           log_name: str = "server.log", stop_timeout_s: float = 30.0) -> tuple[ManagedProcess, LaunchInfo]:
    """Start a server and wait until healthy; return it with what its log says about itself.

    On any failure (exit, timeout, Ctrl-C) the whole group is stopped before the error propagates, so a
    failed trial leaves nothing behind; failures to come up raise a classified `LaunchFailure`.
    """
    proc = start_process(argv, run_dir=run_dir, port=port, host=host, env=env, log_name=log_name)
    try:
        startup_s = proc.wait_healthy(startup_timeout_s, health_path=health_path, headers=headers)
    except KeyboardInterrupt:  # vLLM ignores SIGTERM while it loads: a short grace, then SIGKILL
        with signals.shielded():
            proc.stop_interrupted()
        raise
    except BaseException:
        proc.stop(term_timeout_s=min(stop_timeout_s, 10.0))
        raise
    fields = parse_launch_info(proc.read_log())
    info = LaunchInfo(startup_s=startup_s, log_path=str(proc.log_path), base_url=proc.base_url, **fields)
    return proc, info


def reap_stale(run_dir: str | Path, *, timeout_s: float = 30.0) -> list[dict]:
    """Stop servers that a killed tool left behind under `run_dir` (found by their `server.pid` files).

    A group is signalled only when one of its members is provably the launch's (`procs.owned_members`:
    the launch token in its environment, or a recorded pid and start time), so a reused pid or group id
    is never killed. Returns the pidfile records of the
    servers found running, each with `killed` (pids signalled); removes every pidfile it reads.
    """
    found = []
    for pidfile in sorted(Path(run_dir).rglob(PIDFILE)):
        try:
            record = json.loads(pidfile.read_text())
            pgid, token = int(record["pgid"]), str(record["token"])
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable pidfile %s", pidfile)
            continue
        members = procs.owned_members(pgid, TOKEN_ENV, token, record.get("members") or [])
        if members:
            log.warning("stopping server left by an earlier run: pgid %d, pids %s", pgid, members)
            procs.stop_group(pgid, timeout_s)
            wait_port_free(record.get("host", "127.0.0.1"), int(record.get("port", 0)), timeout_s)
            procs.wait_gpu_released(set(members), timeout_s)
            found.append({**record, "killed": members})
        pidfile.unlink(missing_ok=True)
    return found
