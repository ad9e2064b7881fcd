"""Stopping a job on an SDC alarm with an exit code restart policies can tell from a crash.

Exit code 3 means "stopped by sdc-guard: a check failed, the step was not applied". A crash is
usually 1 (an exception) or 128+N (a signal). Under ``torchrun`` the launcher itself exits with
1 whatever its workers' codes, so the decision is also written as the container's termination
message (``/dev/termination-log``; Kubernetes shows it in the pod status), where a wrapper
script or an operator can find it: see docs/agent-install.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

from .alarm import Alarm
from .publish.events import named_nodes, named_ranks
from .publish.lifecycle import close_all

logger = logging.getLogger(__name__)

SDC_EXIT_CODE = 3
"""The process exit code of a job stopped by an SDC alarm."""

EXIT_SCHEMA = "sdc.exit/v1"
ENV_TERMINATION_LOG = "SDC_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# Kubernetes keeps at most 4096 bytes of a termination message.
_MAX_MESSAGE = 4096


def exit_summary(alarm: Alarm) -> dict[str, object]:
    """The short JSON the termination message carries (the full report is in CloudWatch)."""
    return {
        "schema": EXIT_SCHEMA,
        "exit_code": SDC_EXIT_CODE,
        "check": alarm.check,
        "step": alarm.step,
        "metric": alarm.metric_name,
        "suspects": alarm.suspects,
        "ranks": named_ranks(alarm),
        "nodes": named_nodes(alarm),
    }


def write_termination_message(alarm: Alarm, path: str | None = None) -> bool:
    """Write :func:`exit_summary` to the termination log; False when there is none to write.

    ``path`` defaults to SDC_TERMINATION_LOG, else /dev/termination-log when it exists (it does
    in every Kubernetes container unless terminationMessagePath says otherwise).
    """
    path = path or os.environ.get(ENV_TERMINATION_LOG) or DEFAULT_TERMINATION_LOG
    if path == DEFAULT_TERMINATION_LOG and not os.path.exists(path):
        return False
    text = json.dumps(exit_summary(alarm), separators=(",", ":"))
    if len(text) > _MAX_MESSAGE:
        summary = exit_summary(alarm)
        summary["ranks"], summary["nodes"] = "truncated", "truncated"
        text = json.dumps(summary, separators=(",", ":"))[:_MAX_MESSAGE]
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError as exc:
        logger.warning("sdc: cannot write the termination message to %s: %s", path, exc)
        return False
    return True


def exit_on_alarm(
    alarm: Alarm, *, flush_timeout: float = 10.0, termination_log: str | None = None
) -> NoReturn:
    """Stop this process with SDC_EXIT_CODE (3) after delivering the alarm. Call it on every rank.

    In order: log the alarm, flush every publisher of this process (up to ``flush_timeout``
    seconds; what is left goes to the spool), write the termination message, flush stdout,
    stderr and logging, then ``os._exit(3)``.

    ``os._exit`` and not ``sys.exit``: interpreter teardown with live process groups can hang
    (gloo and NCCL destructors join threads that wait for the GIL), and a job that hangs instead
    of exiting holds every GPU until someone notices. Everything that matters was flushed above.
    While flushing, SIGTERM is held back: ``torchrun`` terminates the other workers as soon as
    the first exits, and the publishing rank must not lose its alarm to that.
    """
    logger.error(
        "sdc: stopping on alarm (exit code %d): check=%s step=%s suspects=%s nodes=%s",
        SDC_EXIT_CODE,
        alarm.check,
        alarm.step,
        alarm.suspects,
        named_nodes(alarm),
    )
    try:
        with _sigterm_deferred():
            if not close_all(flush_timeout):
                logger.error("sdc: not everything was delivered before exit; see the spool")
        write_termination_message(alarm, termination_log)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):
            logging.shutdown()
        os._exit(SDC_EXIT_CODE)


@contextlib.contextmanager
def _sigterm_deferred() -> Iterator[None]:
    """Hold SIGTERM back for the duration (main thread only); the caller exits right after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if received:
            logger.warning("sdc: SIGTERM arrived while flushing the alarm; exiting now")
