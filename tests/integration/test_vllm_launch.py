"""Kill tests against real vLLM: the reason the launcher has a watchdog and records its members.

vLLM's API server forks an engine core, which forks a worker; both rename themselves (setproctitle, which
also hides their environment from /proc) and both outlive a SIGKILLed API server. These tests show the
whole group goes anyway, and that `reap_stale` cleans up what is left when even the watchdog was killed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.real_vllm import MODEL, PYTHON, needs_vllm
from tuner.engine import launcher, procs

pytestmark = needs_vllm


def _start_tool(run_dir: Path) -> tuple[subprocess.Popen, dict]:
    tool = subprocess.Popen(
        [sys.executable, "-m", "tuner.testing.standin_tool", str(run_dir), "--vllm", PYTHON, MODEL,
         "--vllm-arg=--enforce-eager", "--vllm-arg=--kv-cache-memory-bytes=1048576", "--vllm-arg=--max-model-len=512"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([tool.stdout], [], [], 300)
    line = tool.stdout.readline() if ready else ""
    if not line:
        tool.kill()
        raise AssertionError(f"the tool never reported a healthy vLLM: {tool.stderr.read()[-2000:]}")
    return tool, json.loads(line)


def _wait(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _titles(pids) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())
        except OSError:
            pass
    return out


def test_sigkilled_tool_leaves_no_vllm_process(tmp_path):
    tool, srv = _start_tool(tmp_path)
    assert any("EngineCore" in t for t in _titles(srv["members"])), _titles(srv["members"])
    tool.kill()
    tool.wait()
    assert _wait(lambda: procs.group_members(srv["pgid"]) == [], 60), _titles(procs.group_members(srv["pgid"]))
    assert _wait(lambda: launcher.port_is_free("127.0.0.1", srv["port"]), 30)


@pytest.mark.slow  # ~35 s; tests/integration/test_launcher.py reaps stale groups of ordinary processes
def test_reap_stale_finds_vllm_children_by_recorded_pid_and_start_time(tmp_path):
    tool, srv = _start_tool(tmp_path)
    watchdogs = [int(p) for p in os.listdir("/proc") if p.isdigit() and
                 b"tuner.engine.watchdog" in Path(f"/proc/{p}/cmdline").read_bytes()
                 and f"\0{srv['pgid']}\0".encode() in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(watchdogs) == 1
    os.kill(watchdogs[0], signal.SIGKILL)
    tool.kill()
    tool.wait()
    assert _wait(lambda: not procs.is_alive(srv["pid"]), 10)  # the API server: pdeathsig
    time.sleep(1)
    left = procs.group_members(srv["pgid"])
    assert any("EngineCore" in t for t in _titles(left)), "the engine core should have outlived its parent"
    found = launcher.reap_stale(tmp_path)
    assert len(found) == 1 and sorted(found[0]["killed"]) == left
    assert procs.group_members(srv["pgid"]) == []
    assert not (tmp_path / "server.pid").exists()
