"""The launcher against real subprocesses: a stand-in server (`tuner.testing.standin_server`) and a
stand-in tool (`tuner.testing.standin_tool`) that is SIGKILLed or interrupted like a real tuner would be.

Each test checks what a following trial depends on: no process of the server's group left, the port
bindable again, and a failed launch classified rather than reported as "failed".
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tuner.engine import launcher, procs
from tuner.engine.base import LaunchFailure
from tuner.engine.vllm import VllmEngine
from tuner.knobs import Knobs

STANDIN = [sys.executable, "-m", "tuner.testing.standin_server"]


def _launch(tmp_path: Path, *args: str, timeout: float = 30, **kw):
    port = launcher.free_port()
    return launcher.launch([*STANDIN, "--port", str(port), *args], run_dir=tmp_path, port=port,
                           startup_timeout_s=timeout, **kw)


def _wait(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _children_from_log(log_path: str) -> list[int]:
    for line in Path(log_path).read_text().splitlines():
        if line.startswith("INFO children "):
            return json.loads(line.split(" ", 2)[2])
    raise AssertionError("no children line in the log")


def test_launch_health_pidfile_and_clean_stop(tmp_path):
    proc, info = _launch(tmp_path, "--children", "2", "--startup-delay", "0.5")
    assert info.base_url == f"http://127.0.0.1:{proc.port}"
    assert info.startup_s >= 0.5 and info.kv_cache_tokens is None
    record = json.loads((tmp_path / "server.pid").read_text())
    assert (record["pid"], record["pgid"], record["port"]) == (proc.pid, proc.pgid, proc.port)
    assert len(proc.members()) == 3 and os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    assert httpx.get(info.base_url + "/v1/models").json()["data"][0]["id"] == "standin"
    assert proc.watchdog is not None and proc.watchdog.poll() is None
    proc.stop()
    assert proc.members() == []
    assert launcher.port_is_free("127.0.0.1", proc.port)
    assert not (tmp_path / "server.pid").exists()
    assert proc.watchdog.poll() == 0  # released, not killed
    proc.stop()  # idempotent


def test_exit_before_healthy_fails_fast_and_classified(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(LaunchFailure) as e:
        _launch(tmp_path, "--startup-delay", "0.3", "--children", "1",
                "--fail", "ValueError: No available memory for the cache blocks. Try increasing x", timeout=120)
    assert time.monotonic() - t0 < 20  # the process exit is noticed, the 120 s timeout is not waited out
    assert e.value.kind == "no_cache_blocks"
    assert "No available memory" in e.value.message and "No available memory" in e.value.log_tail
    # The forked child of the dead server was stopped too.
    kid = _children_from_log(str(tmp_path / "server.log"))[0]
    assert _wait(lambda: not procs.is_alive(kid), 5)


def test_timeout_is_classified_and_leaves_nothing(tmp_path):
    port = launcher.free_port()
    with pytest.raises(LaunchFailure) as e:
        launcher.launch([*STANDIN, "--port", str(port), "--startup-delay", "60"], run_dir=tmp_path, port=port,
                        startup_timeout_s=2)
    assert e.value.kind == "timeout" and "after 2 s" in e.value.message
    assert launcher.port_is_free("127.0.0.1", port)
    assert not (tmp_path / "server.pid").exists()


def test_signal_death_is_classified(tmp_path):
    with pytest.raises(LaunchFailure) as e:
        _launch(tmp_path, "--fail-signal", str(int(signal.SIGKILL)))
    assert e.value.kind == "crash" and "SIGKILL" in e.value.message


def test_missing_program_is_a_user_error(tmp_path):
    from tuner.errors import UserError

    with pytest.raises(UserError, match="not found"):
        launcher.launch(["/nonexistent/vllm"], run_dir=tmp_path, port=launcher.free_port())


def test_sigterm_ignored_escalates_to_sigkill(tmp_path):
    proc, _ = _launch(tmp_path, "--ignore-term", "--children", "1")
    t0 = time.monotonic()
    proc.stop(term_timeout_s=1.0)
    assert 0.9 < time.monotonic() - t0 < 15
    assert proc.members() == [] and proc.popen.returncode == -signal.SIGKILL
    assert launcher.port_is_free("127.0.0.1", proc.port)


def test_launch_from_a_worker_thread_survives_the_thread(tmp_path):
    """pdeathsig fires when the forking *thread* exits; the launcher forks on a long-lived thread."""
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("p", _launch(tmp_path)[0]))
    t.start()
    t.join()
    proc = result["p"]
    time.sleep(1.0)
    try:
        assert proc.poll() is None, "the server died with the thread that launched it"
        assert httpx.get(proc.base_url + "/health").status_code == 200
    finally:
        proc.stop()


def test_api_key_goes_in_the_environment_never_argv(tmp_path):
    cmd = f"{sys.executable} -m tuner.testing.standin_server --port {{port}} --print-env VLLM_API_KEY {{args}}"
    engine = VllmEngine("m", run_root=tmp_path, command=cmd, api_key="s3cret-key", startup_timeout_s=30)
    with engine.launch(Knobs(), run_dir=tmp_path / "t1") as server:
        cmdline = Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
        assert b"s3cret-key" not in cmdline
        assert "s3cret-key" not in (tmp_path / "t1" / "server.pid").read_text()
        assert "env VLLM_API_KEY=s3cret-key" in server.process.read_log()
        assert server.headers == {"Authorization": "Bearer s3cret-key"}
    assert server.process.members() == []


# --- a separate tool process, killed ---------------------------------------------------------------------

def _start_tool(run_dir: Path, *server_args: str) -> tuple[subprocess.Popen, dict]:
    tool = subprocess.Popen([sys.executable, "-m", "tuner.testing.standin_tool", str(run_dir), *server_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([tool.stdout], [], [], 60)
    if not ready:
        tool.kill()
        raise AssertionError("the tool did not report its server in 60 s")
    line = tool.stdout.readline()
    if not line:
        raise AssertionError(f"the tool died: {tool.stderr.read()}")
    return tool, json.loads(line)


def _watchdog_pid(pgid: int) -> int:
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"tuner.engine.watchdog" in cmd and str(pgid).encode() in cmd:
                return int(name)
    raise AssertionError("no watchdog found")


def test_sigkilled_tool_takes_the_whole_server_group_with_it(tmp_path):
    tool, srv = _start_tool(tmp_path, "--children", "2")
    assert len(srv["members"]) == 3
    tool.kill()
    tool.wait()
    # pdeathsig: the direct child dies at once; the watchdog then stops the rest of the group.
    assert _wait(lambda: not procs.is_alive(srv["pid"]), 5)
    assert _wait(lambda: procs.group_members(srv["pgid"]) == [], 20), procs.group_members(srv["pgid"])
    assert _wait(lambda: launcher.port_is_free("127.0.0.1", srv["port"]), 10)
    assert _wait(lambda: not (tmp_path / "server.pid").exists(), 5)


def test_reap_stale_stops_what_a_killed_tool_and_watchdog_left(tmp_path):
    tool, srv = _start_tool(tmp_path, "--children", "2")
    os.kill(_watchdog_pid(srv["pgid"]), signal.SIGKILL)  # as if the whole machine's tools were killed
    tool.kill()
    tool.wait()
    assert _wait(lambda: not procs.is_alive(srv["pid"]), 5)  # pdeathsig reached the direct child...
    time.sleep(0.5)
    left = procs.group_members(srv["pgid"])
    assert len(left) == 2  # ...but not its children: exactly what --resume must clean up
    assert (tmp_path / "server.pid").exists()
    found = launcher.reap_stale(tmp_path)
    assert [r["pgid"] for r in found] == [srv["pgid"]] and sorted(found[0]["killed"]) == left
    assert procs.group_members(srv["pgid"]) == []
    assert launcher.port_is_free("127.0.0.1", srv["port"])
    assert not (tmp_path / "server.pid").exists()
    assert launcher.reap_stale(tmp_path) == []  # nothing twice


def test_reap_stale_never_touches_a_group_it_cannot_prove_is_its_own(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "t").mkdir()
        (tmp_path / "t" / "server.pid").write_text(json.dumps(
            {"pid": victim.pid, "pgid": victim.pid, "port": 1, "token": "not-its-token",
             "members": [[victim.pid, 1]]}))
        (tmp_path / "server.pid").write_text("{not json")
        assert launcher.reap_stale(tmp_path) == []
        assert victim.poll() is None
        assert not (tmp_path / "t" / "server.pid").exists()
    finally:
        victim.kill()
        victim.wait()


def test_sigint_to_the_tool_stops_everything(tmp_path):
    tool, srv = _start_tool(tmp_path, "--children", "1")
    tool.send_signal(signal.SIGINT)
    out, err = tool.communicate(timeout=60)
    assert tool.returncode == 130, err
    assert '"stopped": true' in out
    assert procs.group_members(srv["pgid"]) == []
    assert launcher.port_is_free("127.0.0.1", srv["port"])
    assert not (tmp_path / "server.pid").exists()


def test_tool_exiting_without_stop_still_cleans_up(tmp_path):
    """An interpreter exit that skipped `stop()` (a bug, an unhandled error) still stops the server."""
    code = ("import sys\nfrom tuner.engine import launcher\n"
            "p = launcher.free_port()\n"
            f"proc, _ = launcher.launch({STANDIN!r} + ['--port', str(p), '--children', '1'], "
            f"run_dir={str(tmp_path)!r}, port=p)\n"
            "print(proc.pgid, p, flush=True)\n"
            "raise SystemExit(3)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 3, out.stderr
    pgid, port = map(int, out.stdout.split())
    assert procs.group_members(pgid) == []
    assert launcher.port_is_free("127.0.0.1", port)


def test_server_that_dies_after_healthy_is_noticed(tmp_path):
    """A launch that came up can still die (OOM under load): run_load refuses to measure a dead server."""
    from tuner.engine.http import HTTPServer
    from tuner.workload.model import WorkloadRequest

    proc, info = _launch(tmp_path)
    server = HTTPServer(proc, info, model="standin")
    assert server.check_alive() is None
    with open(proc.log_path, "a") as f:
        f.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    os.kill(proc.pid, signal.SIGKILL)
    assert _wait(lambda: server.check_alive() is not None, 5)
    assert server.died.kind == "oom" and "after becoming healthy" in server.died.message
    with pytest.raises(LaunchFailure):
        server.run_load([WorkloadRequest(prompt="x", output_tokens=1)], [0.0], offered_rate=1.0)
    server.stop()
    assert proc.members() == []
