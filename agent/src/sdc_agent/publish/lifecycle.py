"""Every live publisher of this process, flushed together at exit (atexit, exit_on_alarm)."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Protocol

logger = logging.getLogger(__name__)

EXIT_FLUSH_TIMEOUT = 10.0
"""Seconds the interpreter's exit waits for queued alarms before spooling them."""


class _Closable(Protocol):
    def close(self, timeout: float | None = None) -> bool: ...


_live: weakref.WeakSet[_Closable] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False


def register(publisher: _Closable) -> None:
    """Track a publisher so the process's exit flushes it (registers the atexit hook once)."""
    global _registered
    with _lock:
        _live.add(publisher)
        if not _registered:
            atexit.register(close_all, EXIT_FLUSH_TIMEOUT)
            _registered = True


def close_all(timeout: float = EXIT_FLUSH_TIMEOUT) -> bool:
    """Flush then close every live publisher within ``timeout`` seconds in all; never raises.

    What cannot be delivered in time goes to the spool (or, failing that, to the error log).
    True when everything was delivered.
    """
    deadline = time.monotonic() + timeout
    ok = True
    with _lock:
        publishers = list(_live)
    for publisher in publishers:
        try:
            ok = publisher.close(max(0.0, deadline - time.monotonic())) and ok
        except Exception:
            logger.exception("sdc: closing a publisher failed")
            ok = False
    return ok
