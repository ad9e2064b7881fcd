"""The background sender: one daemon thread, a bounded queue, retries, the spool.

The training thread only ever does non-blocking work here: ``put_nowait`` on the queue, a
counter increment, or (when the queue is full or the sender is closed) one small local file
write to the spool. Everything that touches the network runs on the sender thread.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from .events import MAX_METRICS_PER_CALL, Delivery, liveness_metric_data
from .liveness import LivenessBatch
from .retry import backoff_delay, error_code, is_rejection, is_transient
from .settings import PublishSettings, RetryPolicy
from .spool import DeliveryFailed, Spool
from .transport import CloudWatchTransport

logger = logging.getLogger(__name__)

# Spooled records are re-sent with a single attempt each: a failure means AWS is still out of
# reach, and waiting out backoffs there would hold back alarms queued behind the drain.
_DRAIN_POLICY = RetryPolicy(attempts=1)


@dataclass
class _Flush:
    """A marker: everything queued before it has been handled when ``done`` is set."""

    done: threading.Event = field(default_factory=threading.Event)
    delivered: bool = False


_WAKE = object()  # liveness became pending: recompute the wait
_STOP = object()


class Sender:
    """Delivers queued alarms and rank maps, batches liveness, spools what cannot be sent."""

    def __init__(
        self,
        settings: PublishSettings,
        transport: CloudWatchTransport,
        spool: Spool,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.spool = spool
        self.liveness = LivenessBatch(settings.liveness_interval)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=settings.queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._inflight: Delivery | None = None
        self._closed = False
        # Records neither delivered nor waiting in the spool (logged, or rejected by AWS as
        # invalid) since the last flush.
        self._unspooled = 0
        self._unreachable = False  # the last delivery failed for a transient reason

    # ---- called from the training thread: never blocks on the network, never raises ----

    def submit(self, delivery: Delivery) -> None:
        """Queue a delivery; spool it right away when the queue is full or the sender closed."""
        with self._lock:
            closed = self._closed
        if not closed:
            self._ensure_started()
            try:
                self._queue.put_nowait(delivery)
                return
            except queue.Full:
                logger.error(
                    "sdc: publish queue full (%d); spooling the %s",
                    self._queue.maxsize,
                    delivery.kind,
                )
        self.spool_or_log(delivery)

    def add_liveness(
        self,
        step: int,
        audit_passes: int,
        weight_check_passes: int,
        unconfirmed_sensor_flags: int = 0,
        audits_skipped: int = 0,
    ) -> None:
        """Count passing checks (and unconfirmed sensor flags, skipped audits); the sender sends
        them at most once per liveness interval."""
        if self.liveness.add(
            step, audit_passes, weight_check_passes, unconfirmed_sensor_flags, audits_skipped
        ):
            self._ensure_started()
            # When full, the sender is busy anyway and recomputes its wait after each item.
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(_WAKE)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for everything queued, pending liveness and the spool.

        On timeout, what is still queued or in flight is spooled (an alarm may then arrive
        twice, never zero times). True when nothing is left to send.
        """
        if not self._running():
            if not self.spool.records():
                return True
            self._ensure_started()  # a previous run's spool gets its chance at this exit
            if not self._running():
                return False
        marker = _Flush()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(marker, timeout=max(0.0, timeout))
        except queue.Full:
            pass
        else:
            if marker.done.wait(max(0.0, deadline - time.monotonic())):
                return marker.delivered
        self._spool_leftovers()
        return False

    def close(self, timeout: float) -> bool:
        """Flush, then stop the thread (waiting for it within ``timeout``); later submissions
        go straight to the spool."""
        deadline = time.monotonic() + timeout
        delivered = self.flush(timeout)
        with self._lock:
            self._closed = True
            thread = self._thread
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_STOP)
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
        return delivered

    def spool_or_log(self, delivery: Delivery) -> None:
        """Spool a delivery; if the spool refuses it, log all of it so it is never lost."""
        if delivery.done:
            return
        if self.spool.put(delivery):
            logger.warning(
                "sdc: %s not delivered yet, spooled to %s", delivery.kind, self.spool.directory
            )
            return
        with self._lock:
            self._unspooled += 1
        logger.error(
            "sdc: could not deliver or spool the %s; the whole record follows: %s",
            delivery.kind,
            json.dumps(delivery.to_record(), separators=(",", ":")),
        )

    def reject_or_log(self, delivery: Delivery, reason: str) -> None:
        """Keep a delivery AWS rejected as invalid aside in the spool (never re-sent); if the
        spool cannot keep it, log all of it."""
        if delivery.done:
            return
        with self._lock:
            self._unspooled += 1
        if self.spool.reject(delivery, reason):
            return
        logger.error(
            "sdc: AWS rejected the %s as invalid (%s) and the spool cannot keep it; the whole "
            "record follows: %s",
            delivery.kind,
            reason,
            json.dumps(delivery.to_record(), separators=(",", ":")),
        )

    # ---- the sender thread ----

    def start(self) -> None:
        """Start the sender thread now (it drains the spool first); idempotent."""
        self._ensure_started()

    def _running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def _ensure_started(self) -> None:
        with self._lock:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._run, name="sdc-publisher", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        if self.spool.records():
            self._guarded(self._drain_spool)  # a previous run's leftovers
        while True:
            wait = self.liveness.seconds_until_due(self._clock())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if isinstance(item, Delivery):
                self._guarded(functools.partial(self._handle, item))
            elif isinstance(item, _Flush):
                self._guarded(functools.partial(self._handle_flush, item))
                item.done.set()
            self._guarded(self._send_liveness)

    def _guarded(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception:  # the thread must outlive any bug; deliveries are spooled in _handle
            logger.exception("sdc: publisher error (continuing)")

    def _handle(self, delivery: Delivery) -> None:
        self._set_inflight(delivery)
        # While AWS is known to be out of reach, one attempt per delivery: the full retry
        # schedule was just spent on the previous one, and a queue of alarms behind a silent
        # endpoint would otherwise take attempts x read_timeout each to reach the spool.
        policy = _DRAIN_POLICY if self._unreachable else self.settings.retry
        try:
            self.deliver(delivery, policy)
        except DeliveryFailed as failed:
            self._unreachable = failed.transient
            logger.warning("sdc: could not deliver the %s: %s", delivery.kind, failed.reason)
            if failed.rejected:
                self.reject_or_log(failed.remainder, failed.reason)
            else:
                self.spool_or_log(failed.remainder)
        except BaseException:
            self.spool_or_log(self._inflight or delivery)
            raise
        else:
            self._unreachable = False
            self._drain_spool()
        finally:
            self._set_inflight(None)

    def _handle_flush(self, marker: _Flush) -> None:
        self._send_liveness(force=True)
        if self.spool.records():
            self._drain_spool()
        with self._lock:
            unspooled, self._unspooled = self._unspooled, 0
        marker.delivered = (
            not unspooled and not self.liveness.pending() and not self.spool.records()
        )

    def _set_inflight(self, delivery: Delivery | None) -> None:
        with self._lock:
            self._inflight = delivery

    def deliver(self, delivery: Delivery, policy: RetryPolicy) -> None:
        """Send the log event first, then the metrics; raise DeliveryFailed with what is left.

        The report goes first so that when the metric wakes the CloudWatch alarm, the report
        the workflow reads is already there. If CloudWatch Logs refuses the report (say the role
        lacks logs permissions), the metrics still go out: they are what fires the alarm, and
        the refused report waits in the spool.
        """
        refused: DeliveryFailed | None = None
        if delivery.message is not None:
            message = delivery.message
            try:
                self._attempt(
                    lambda: self.transport.put_log_event(
                        delivery.log_group, delivery.log_stream, message, int(time.time() * 1000)
                    ),
                    policy,
                    delivery,
                    f"PutLogEvents {delivery.log_group}/{delivery.log_stream}",
                )
            except DeliveryFailed as failed:
                if failed.transient:
                    raise  # AWS out of reach: the metrics would fail the same way
                refused = failed
            else:
                delivery = delivery.without_message()
                self._update_inflight(delivery)
        namespace = delivery.namespace
        while delivery.metrics:
            chunk = list(delivery.metrics[:MAX_METRICS_PER_CALL])

            def put_chunk(c: list[dict[str, Any]] = chunk) -> None:
                # The timestamp of each attempt, as the call is made.
                self.transport.put_metric_data(namespace, c, datetime.now(timezone.utc))

            self._attempt(
                put_chunk,
                policy,
                delivery,
                f"PutMetricData {delivery.namespace}",
            )
            delivery = replace(delivery, metrics=delivery.metrics[len(chunk) :])
            self._update_inflight(delivery)
        if refused is not None:
            raise DeliveryFailed(
                delivery, refused.reason, transient=False, rejected=refused.rejected
            )

    def _update_inflight(self, delivery: Delivery) -> None:
        with self._lock:
            if self._inflight is not None:
                self._inflight = delivery

    def _attempt(
        self, call: Callable[[], None], policy: RetryPolicy, delivery: Delivery, what: str
    ) -> None:
        for retry_index in range(policy.attempts):
            try:
                call()
                return
            except Exception as exc:
                transient = is_transient(exc)
                if not transient or retry_index == policy.attempts - 1:
                    reason = f"{what}: {type(exc).__name__}: {exc}"
                    raise DeliveryFailed(
                        delivery, reason, transient=transient, rejected=is_rejection(exc)
                    ) from exc
                delay = backoff_delay(policy, retry_index, self._rng)
                logger.info(
                    "sdc: %s failed (%s), retrying in %.2fs",
                    what,
                    error_code(exc) or type(exc).__name__,
                    delay,
                )
                self._sleep(delay)

    def _drain_spool(self) -> None:
        sent, left = self.spool.drain(lambda d: self.deliver(d, _DRAIN_POLICY))
        if sent:
            logger.info("sdc: delivered %d spooled record(s), %d left", sent, left)

    def _send_liveness(self, force: bool = False) -> None:
        counts = self.liveness.take(self._clock(), force=force)
        if counts is None:
            return
        data = liveness_metric_data(
            self.settings.cluster_name,
            self.settings.job_name,
            counts.audit_passes,
            counts.weight_check_passes,
            counts.unconfirmed_sensor_flags,
            counts.audits_skipped,
        )
        try:
            # One attempt: liveness is not worth holding alarms back for; failed counts are
            # kept and go out with the next batch.
            self.transport.put_metric_data(
                self.settings.namespace, data, datetime.now(timezone.utc)
            )
        except Exception as exc:
            self.liveness.restore(counts)
            logger.warning("sdc: liveness metrics not sent (kept for the next batch): %s", exc)

    def _spool_leftovers(self) -> None:
        with self._lock:
            inflight, self._inflight = self._inflight, None
        if inflight is not None:
            self.spool_or_log(inflight)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Delivery):
                self.spool_or_log(item)
            elif isinstance(item, _Flush):
                item.done.set()
        if self.liveness.pending():
            counts = self.liveness.take(self._clock(), force=True)
            logger.warning("sdc: liveness counts not delivered at exit: %s", counts)
