"""Ports on this host: a free one for a new server, and whether a stopped one has let go of its own."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick). Another process could take it before the
    server binds; a launch that then fails is classified as a crash with the bind error in its log."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """True when a new server could bind `port` now (SO_REUSEADDR, as uvicorn binds: TIME_WAIT is fine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not port_is_free(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
