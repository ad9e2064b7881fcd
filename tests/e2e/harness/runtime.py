"""The Lambda runtime both drivers share: the real handlers, run in this process as Lambda would.

The template-built pipeline (pipeline.py) and the deployed rehearsal (deployed.py) differ in
where a function's configuration comes from (the synthesized template, or what CloudFormation
created) and in nothing else about running it: :class:`LambdaRuntime` takes each function's name,
ARN, Handler string and environment, and from then on is the one place that
- answers moto's Lambda invoke (tests/support/moto_lambda.py, while installed), which is how
  Step Functions tasks reach the functions: synchronously, or queued
  (``InvocationType=Event``) on a thread of its own;
- runs the handler with a context object, its environment through
  ``sdc_remediation.config.environment`` (this thread only, never ``os.environ``), and reports an
  unhandled exception as a function error whose ``errorType`` is the exception's class name (what
  the workflow's Retry/Catch match);
- counts the invocations in flight, so a driver can close: refuse new ones, stop what it started,
  and wait for the rest (:meth:`close`).

The process environment is shared by every thread here, and botocore and requests iterate it
whenever they build a client, so it is written only while no thread of a driver runs:
:func:`process_environment` at a driver's start and close, with the settings every function must
share (:func:`shared_runtime_env`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.moto_lambda import function_error, route_invokes

REPO = Path(__file__).resolve().parents[3]
LAMBDAS = REPO / "lambdas"

QUIESCE_SECONDS = 120.0
"""How long closing waits for the invocations in flight to return (a busy machine)."""

_INVOKE_LOCK = threading.RLock()
"""Invocations are serialised process-wide: the handlers share Powertools' metrics and logger
singletons, and one Lambda execution environment never runs two invocations at once either."""
_URL_INVOKE_LOCK = threading.RLock()
"""Invocations through a function URL (the approve function's) are serialised among themselves
only: a function may call that URL and wait for the answer (request_approval settles the
canary's approval so), which under the one lock above would wait for itself. The function
behind the URL uses no Powertools metrics, so the logger is all it shares with the others."""


@contextlib.contextmanager
def process_environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back exactly what was there.

    Only for moments when no other thread of ours runs (see the module docstring): a thread that
    iterates os.environ while a key is added or removed fails with KeyError or RuntimeError.
    Only the given keys are touched, unlike ``mock.patch.dict``, which clears and refills all.
    """
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def shared_runtime_env(
    environments: Mapping[str, Mapping[str, str]], *, quiet: bool = False
) -> dict[str, str]:
    """The settings every function must share when all run in this one process.

    ``environments`` maps each function (by any name) to its environment. Powertools reads its
    ``POWERTOOLS_*`` settings and ``LOG_LEVEL`` from the process environment when its singletons
    are built (POWERTOOLS_METRICS_DISABLED at each flush), so they are set once for a whole
    chain; raises ValueError naming the variable and two functions that disagree on it (the
    template gives them all the same). Adds POWERTOOLS_TRACE_DISABLED (no X-Ray daemon here)
    and, when ``quiet``, POWERTOOLS_METRICS_DISABLED (EMF lines on stdout would interleave with
    the demo's timeline).
    """
    values: dict[str, str] = {}
    owner: dict[str, str] = {}
    for function, variables in environments.items():
        for key, value in variables.items():
            if not (key.startswith("POWERTOOLS_") or key == "LOG_LEVEL"):
                continue
            if values.setdefault(key, value) != value:
                raise ValueError(
                    f"the functions run in one process here, so they must share {key}; "
                    f"{owner[key]} has {values[key]!r}, {function} {value!r}"
                )
            owner.setdefault(key, function)
    values["POWERTOOLS_TRACE_DISABLED"] = "true"
    if quiet:
        values["POWERTOOLS_METRICS_DISABLED"] = "true"
    return values


@dataclass
class LambdaContext:
    """The attributes of the Lambda context object that Powertools reads."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int = 256
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""

    def get_remaining_time_in_millis(self) -> int:
        """Plenty: local invocations are not cut off."""
        return 300_000


@dataclass
class Invocation:
    """One Lambda invocation the workflow made."""

    folder: str
    payload: dict[str, Any]
    started: float
    ended: float = 0.0
    result: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Function:
    """What the runtime needs of one function: how it is named and what it runs with."""

    name: str
    """The name an invoke gives (the last part of its ARN)."""
    arn: str
    handler: str
    """The Handler string, e.g. ``localize.handler.handler``."""
    environment: Mapping[str, str]
    """Its whole environment, endpoints of the stand-ins included."""

    @property
    def folder(self) -> str:
        """The contract folder (docs/CONTRACT.md) the Handler names."""
        return self.handler.split(".", 1)[0]

    @property
    def module(self) -> str:
        """``localize.handler.handler`` -> ``localize.handler`` (what the runtime imports)."""
        return self.handler.rsplit(".", 1)[0]


class LambdaRuntime:
    """``functions`` (by name) run as the Lambda service would run them, in this process.

    ``closed_error`` is the errorType an invocation gets once the driver closed (a straggling
    execution's), named after the driver so a log says whose close refused it.
    """

    def __init__(self, functions: Mapping[str, Function], *, closed_error: str) -> None:
        """Prepare; nothing is imported or patched yet."""
        self.functions = dict(functions)
        self.closed_error = closed_error
        self.invocations: list[Invocation] = []
        self._in_flight = threading.Condition()
        self._running = 0
        self._closing = False
        self._config: Any = None

    # ------------------------------------------------------------------ starting
    def import_handlers(self) -> None:
        """Import every handler now, in this thread, with the process environment already set:
        Powertools builds its singletons at import, and an import inside an invocation's thread
        would race another's."""
        if str(LAMBDAS) not in sys.path:
            sys.path.insert(0, str(LAMBDAS))
        for function in self.functions.values():
            importlib.import_module(function.module)
        self._config = importlib.import_module("sdc_remediation.config")

    @contextlib.contextmanager
    def installed(self) -> Iterator[LambdaRuntime]:
        """Route moto's in-process Lambda invokes here for the block."""
        with route_invokes(self.invoke, self.invoke_event):
            yield self

    # ------------------------------------------------------------------ invoking
    def invoke(self, function_name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        """A synchronous invoke of ``function_name`` (a name or an ARN) with the JSON ``body``:
        the handler's JSON result, or a function error (``x-amz-function-error`` set in
        ``response_headers``) once the runtime closed or for a function it does not have."""
        if not self._enter():
            return function_error(response_headers, self.closed_error, "the driver closed")
        try:
            return self._run(function_name, body, response_headers)
        finally:
            self._exit()

    def invoke_url(self, function_name: str, body: Any, response_headers: dict[str, str]) -> bytes:
        """A synchronous invoke through a function URL (see ``_URL_INVOKE_LOCK``): as
        :meth:`invoke`, beside the workflow's invocations rather than after them."""
        if not self._enter():
            return function_error(response_headers, self.closed_error, "the driver closed")
        try:
            return self._run(function_name, body, response_headers, lock=_URL_INVOKE_LOCK)
        finally:
            self._exit()

    def invoke_event(self, function_name: str, body: Any) -> bytes:
        """An asynchronous invoke (``InvocationType=Event``, as an alarm action or a schedule
        may invoke): answered at once (moto answers 202),
        and run afterwards on a thread of its own, as Lambda queues it and runs it once the
        caller went on. Counted as running from now, so closing waits for it. Its outcome is
        only in ``invocations`` (a function error there, as in the function's logs); Lambda's
        two retries of a failed asynchronous invocation are not stood in."""
        if not self._enter():
            return b""

        def run() -> None:
            try:
                self._run(function_name, body, {})
            finally:
                self._exit()

        name = function_name.rsplit(":", 1)[-1]
        threading.Thread(target=run, name=f"lambda-event-{name}", daemon=True).start()
        return b""

    def call(self, function_name: str, payload: Any) -> Any:
        """Invoke as a function's trigger would (a schedule, an alarm action), through the same
        path the workflow's invokes take; returns its result, raises RuntimeError with the
        function's error."""
        headers: dict[str, str] = {}
        out = json.loads(self.invoke(function_name, json.dumps(payload), headers))
        if "x-amz-function-error" in headers:
            raise RuntimeError(f"{function_name} failed: {out['errorType']}: {out['errorMessage']}")
        return out

    def _run(
        self,
        function_name: str,
        body: Any,
        response_headers: dict[str, str],
        *,
        lock: Any = _INVOKE_LOCK,
    ) -> bytes:
        name = function_name.rsplit(":", 1)[-1]
        function = self.functions.get(name)
        if function is None:
            return function_error(
                response_headers, "ResourceNotFoundException", f"no function {name!r} here"
            )
        payload = json.loads(body) if body else {}
        call = Invocation(folder=function.folder, payload=payload, started=time.time())
        with lock, self._config.environment(function.environment):
            try:
                module = importlib.import_module(function.module)
                handler: Callable[..., Any] = getattr(module, function.handler.rsplit(".", 1)[1])
                call.result = handler(payload, LambdaContext(function.name, function.arn))
                out = json.dumps(call.result).encode()
            except Exception as error:
                call.error = f"{type(error).__name__}: {error}"
                out = function_error(response_headers, type(error).__name__, str(error))
            finally:
                call.ended = time.time()
                self.invocations.append(call)
        return out

    # ------------------------------------------------------------------ closing
    def _enter(self) -> bool:
        with self._in_flight:
            if self._closing:
                return False
            self._running += 1
            return True

    def _exit(self) -> None:
        with self._in_flight:
            self._running -= 1
            self._in_flight.notify_all()

    def close(self, stop: Callable[[], None], timeout: float = QUIESCE_SECONDS) -> None:
        """Refuse new invocations, call ``stop`` (the driver stops what it started: executions
        waiting for approval, retry loops), then wait for the invocations in flight to return,
        so the process environment can be restored with no thread of the driver left to read
        it. Raises TimeoutError naming how many still run after ``timeout`` seconds."""
        with self._in_flight:
            self._closing = True
        stop()
        with self._in_flight:
            if not self._in_flight.wait_for(lambda: self._running == 0, timeout):
                raise TimeoutError(
                    f"{self._running} Lambda invocation(s) still running "
                    f"{timeout:.0f} s after the driver was closed"
                )
