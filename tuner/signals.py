"""Ctrl-C and SIGTERM as a stop request that is never lost, whatever code they land in.

Python's default turns SIGINT into a `KeyboardInterrupt` raised at whatever bytecode runs; code that
catches it (asyncio's own handler, which only cancels the main task; a library's `except BaseException`)
or a cancellation that arrives as a task returns can swallow it, and the study then runs on. `install()`
(the `tune` and `tune worker` commands call it) replaces that with one handler for both signals that:

- records the request (`requested()`), so `check()` raises `KeyboardInterrupt` at the next safe point
  (before a trial, after a load run) even if the first one was swallowed;
- raises `KeyboardInterrupt` at once, as before, except
- inside an event loop running in this thread, where it cancels the loop's tasks instead (raising in the
  middle of the loop's machinery could lose a wake-up and hang it; the replay client turns the
  cancellation into an interrupted run), and
- inside a `deferred()` section (a trial record being written, a server being spawned), where it waits
  for the section's end; `shielded()` sections (the clean-up of an interrupt already under way) drop it.

A second signal while the first is being handled raises at once (outside shielded sections), so an
impatient second Ctrl-C still gets through.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_count = 0          # signals received since install()/reset()
_defer = 0          # depth of deferred() sections
_shield = 0         # depth of shielded() sections
_pending = False    # a signal came inside a deferred() section
_installed = False


def requested() -> bool:
    """True once SIGINT or SIGTERM arrived (after `install()`)."""
    return _count > 0


def check() -> None:
    """A safe point: raise `KeyboardInterrupt` if a stop was requested."""
    if _count and not _shield:
        raise KeyboardInterrupt


def reset() -> None:
    global _count, _pending
    _count, _pending = 0, False


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def _handler(signum, frame) -> None:
    global _count, _pending
    _count += 1
    if _shield:
        return
    if _defer:
        _pending = True
        return
    if _count == 1:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_cancel_all, loop)
            return
    raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT and SIGTERM through the handler above (main thread only; idempotent)."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)
    _installed = True


def installed() -> bool:
    return _installed


@contextmanager
def deferred() -> Iterator[None]:
    """A section a signal must not cut in two: the stop it asks for is raised when the section ends."""
    global _defer, _pending
    _defer += 1
    try:
        yield
    finally:
        _defer -= 1
    if not _defer and _pending:
        _pending = False
        if not _shield:
            raise KeyboardInterrupt


@contextmanager
def shielded() -> Iterator[None]:
    """Clean-up of a stop already under way: further signals are counted but raise nothing here."""
    global _shield
    _shield += 1
    try:
        yield
    finally:
        _shield -= 1
