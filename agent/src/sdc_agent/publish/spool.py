"""The local spool: alarms (and rank maps) that could not be sent yet, kept on disk as JSONL.

Each job spools into its own private directory under the configured one
(``$SDC_SPOOL_DIR/job-<cluster>-<job>-<hash>``, or ``job-<cluster>-<namespace>_<job>_<pod>-<hash>``
with per-pod report streams; see :meth:`Spool.for_job`): mode 0700 and owned by this process's
user, or the spool refuses to use it (logged once; publishing goes on, and what cannot be sent is
logged whole instead). A record is re-sent only from its own job's directory and only when it is
addressed to that job (its log group, the publisher's log stream, namespace and metric
dimensions), so a record another job or user planted is never sent with this job's credentials
(one found in the job's directory is set aside as ``<name>.foreign``, unsent, and logged).

One record per file (``sdc-<utc time>-<pid>-<id>.jsonl``, one JSON line each), written by
write-then-rename. That keeps the spool safe without locks when several processes share it (the
ranks of a job on a node, or a restarted pod on a hostPath volume): a writer never blocks on
another process, a crash never leaves half a record, and a drainer claims a record by renaming it,
so two drainers never send the same record. ``cat <dir>/*.jsonl`` reads it as one JSONL stream.

A record AWS refuses as invalid (a validation error, not throttling, an outage or a missing
permission) is moved once to ``rejected/`` with a ``.reason`` file beside it, and never re-sent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sdc_contract.metrics import CLUSTER_DIMENSION, JOB_DIMENSION

from ..errors import SdcAgentError
from .events import Delivery
from .settings import PublishSettings

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl"
CLAIMED = ".sending"
BAD = ".bad"
REJECTED_DIR = "rejected"
"""Subdirectory of records AWS refused as invalid: kept for a person, never re-sent."""
REASON = ".reason"
FOREIGN = ".foreign"
# A record claimed this long ago by a drainer that never finished (it died) is reclaimed.
STALE_CLAIM_SECONDS = 600.0
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


class DeliveryFailed(SdcAgentError):
    """A delivery could not be completed; ``remainder`` is what is still to send.

    ``transient`` says whether AWS was out of reach (network, throttling, 5xx) rather than
    refusing this one request (permissions, validation). ``rejected`` says AWS refused the
    request as invalid: sending it again cannot succeed, so the spool moves it aside.
    """

    def __init__(
        self, remainder: Delivery, reason: str, *, transient: bool = True, rejected: bool = False
    ) -> None:
        super().__init__(reason)
        self.remainder = remainder
        self.reason = reason
        self.transient = transient
        self.rejected = rejected and not transient


@dataclass(frozen=True)
class SpoolOwner:
    """The job a spool belongs to: where its records go, and the directory that holds them."""

    cluster_name: str
    job_name: str
    log_group: str
    namespace: str
    log_stream: str = ""
    """The stream its records go to; empty means the job name (the default report stream)."""

    @classmethod
    def of(cls, settings: PublishSettings) -> SpoolOwner:
        """The job (and stream) a publisher with ``settings`` publishes for."""
        return cls(
            settings.cluster_name,
            settings.job_name,
            settings.log_group,
            settings.namespace,
            settings.log_stream,
        )

    @property
    def stream(self) -> str:
        """The log stream a record must be addressed to: ``log_stream``, else the job name."""
        return self.log_stream or self.job_name

    def directory_name(self) -> str:
        """``job-<cluster>-<job>-<hash>``: readable, one path segment whatever the names hold
        (a job name may contain ``/``), and distinct for distinct jobs (the hash is of both
        names whole, since the readable part is cleaned and shortened).

        A stream other than the job's (``<namespace>/<job>/<pod>``) gets a directory of its
        own, ``job-<cluster>-<stream>-<hash>``: only that pod may write that stream, so another
        pod of the job finding its records on a shared node could only set them aside, and
        they would never be sent when the pod comes back.
        """
        if self.stream == self.job_name:
            digest = hashlib.sha256(f"{self.cluster_name}\0{self.job_name}".encode()).hexdigest()
            readable = self.job_name
        else:
            key = f"{self.cluster_name}\0{self.job_name}\0{self.stream}"
            digest = hashlib.sha256(key.encode()).hexdigest()
            readable = self.stream
        cluster = _UNSAFE_NAME_CHARS.sub("_", self.cluster_name)[:48]
        name = _UNSAFE_NAME_CHARS.sub("_", readable)[:96]
        return f"job-{cluster}-{name}-{digest[:16]}"

    def mismatch(self, delivery: Delivery) -> str | None:
        """Why ``delivery`` is not addressed to this job's stream, or None when it is."""
        if (delivery.log_group, delivery.log_stream) != (self.log_group, self.stream):
            return f"its log stream is {delivery.log_group}/{delivery.log_stream}"
        if delivery.namespace != self.namespace:
            return f"its metric namespace is {delivery.namespace}"
        ours = {CLUSTER_DIMENSION: self.cluster_name, JOB_DIMENSION: self.job_name}
        for metric in delivery.metrics:
            for dimension in metric.get("Dimensions") or ():
                name = dimension.get("Name") if isinstance(dimension, dict) else None
                if name in ours and dimension.get("Value") != ours[name]:
                    return f"a metric has {name}={dimension.get('Value')!r}"
        return None


class Spool:
    """A private directory of spooled deliveries with a size limit.

    ``owner``, when given, is the job whose records this spool sends: a record addressed
    elsewhere is left where it is, never sent. :meth:`for_job` builds the spool of one job.
    """

    def __init__(
        self, directory: str | os.PathLike[str], max_bytes: int, *, owner: SpoolOwner | None = None
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.owner = owner
        self._refusal_logged = False

    @classmethod
    def for_job(cls, settings: PublishSettings) -> Spool:
        """The spool of the job ``settings`` describe: its own subdirectory of
        ``settings.spool_dir``, sending only records addressed to that job."""
        owner = SpoolOwner.of(settings)
        return cls(
            Path(settings.spool_dir, owner.directory_name()), settings.spool_max_bytes, owner=owner
        )

    @property
    def rejected_directory(self) -> Path:
        """Where records AWS refused as invalid are kept (never re-sent)."""
        return self.directory / REJECTED_DIR

    def put(self, delivery: Delivery) -> bool:
        """Store one delivery; False (never an exception) when the spool is full, unwritable
        or not private."""
        line = json.dumps(delivery.to_record(), separators=(",", ":")) + "\n"
        data = line.encode()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self.is_private():
                return False
            if self.size_bytes() + len(data) > self.max_bytes:
                logger.error(
                    "sdc: spool %s is full (%d bytes allowed)", self.directory, self.max_bytes
                )
                return False
            self._write_atomic(self.directory / _new_name(), data)
        except OSError as exc:
            logger.error("sdc: cannot write to spool %s: %s", self.directory, exc)
            return False
        return True

    def reject(self, delivery: Delivery, reason: str) -> bool:
        """Keep a delivery AWS refused as invalid in ``rejected/``, never to be sent again.

        False (never an exception) when it cannot be kept; the caller then logs it whole.
        """
        if delivery.done:
            return True
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self.is_private():
                return False
            line = json.dumps(delivery.to_record(), separators=(",", ":")) + "\n"
            if self.size_bytes() + len(line) > self.max_bytes:
                logger.error(
                    "sdc: spool %s is full (%d bytes allowed)", self.directory, self.max_bytes
                )
                return False
            self._keep_rejected(_new_name(), line.encode(), reason, delivery.kind)
        except OSError as exc:
            logger.error("sdc: cannot write to spool %s: %s", self.directory, exc)
            return False
        return True

    def is_private(self) -> bool:
        """True when the directory is this user's alone: a real directory (not a symbolic link),
        owned by this process's user, with no access for group or others. Logs once why not.

        Anyone who can write the directory could plant records this job would send with its
        credentials, or read the alarms in it; so a spool directory that is not private is not
        used at all.
        """
        try:
            info = os.lstat(self.directory)
        except FileNotFoundError:
            return False  # nothing spooled yet; put() creates it
        except OSError as exc:
            self._log_refusal(f"cannot be inspected ({exc})")
            return False
        uid = os.geteuid()
        if stat.S_ISLNK(info.st_mode):
            problem = "is a symbolic link"
        elif not stat.S_ISDIR(info.st_mode):
            problem = "is not a directory"
        elif info.st_uid != uid:
            problem = f"is owned by uid {info.st_uid}, not by this process's uid {uid}"
        elif info.st_mode & 0o077:
            problem = f"has mode {stat.S_IMODE(info.st_mode):04o}: others may read or write it"
        else:
            return True
        self._log_refusal(problem)
        return False

    def records(self) -> list[Path]:
        """Spooled records not being sent right now, oldest first ([] when not private)."""
        if not self.is_private():
            return []
        try:
            return sorted(self.directory.glob(f"sdc-*{SUFFIX}"))
        except OSError:
            return []

    def size_bytes(self) -> int:
        """Bytes held by spooled, claimed and rejected records."""
        total = 0
        for pattern in ("sdc-*", f"{REJECTED_DIR}/sdc-*"):
            for path in self.directory.glob(pattern):
                try:
                    total += path.stat().st_size
                except OSError:
                    continue  # claimed or removed by another process meanwhile
        return total

    def read(self, path: Path) -> Delivery:
        """Parse one record file; ValueError when it is not a spool record."""
        text = path.read_text()
        return Delivery.from_record(json.loads(text))

    def drain(self, send: Callable[[Delivery], object]) -> tuple[int, int]:
        """Send spooled records oldest first. Returns (sent, left).

        ``send`` delivers one record or raises DeliveryFailed with what is left, which goes back
        into the spool under its old name (so it keeps its place in the order). A transient
        failure stops the drain (AWS is out of reach again); a record AWS refuses for lack of a
        permission is kept and the drain goes on, so one bad record cannot hold back the others;
        a record AWS rejects as invalid is moved to ``rejected/`` and never sent again. A record
        addressed to another job is set aside unsent (``.foreign``).
        """
        if not self.is_private():
            return 0, 0
        self._reclaim_stale()
        sent = 0
        for path in self.records():
            # The claim time is in the name (a rename keeps the old mtime).
            claimed = path.with_name(f"{path.name}.{int(time.time())}{CLAIMED}")
            try:
                os.rename(path, claimed)
            except OSError:
                continue  # another drainer took it
            try:
                delivery = self.read(claimed)
            except (OSError, ValueError) as exc:
                self._quarantine(claimed, exc)
                continue
            foreign = self.owner.mismatch(delivery) if self.owner is not None else None
            if foreign is not None:
                self._set_aside_foreign(claimed, foreign)
                continue
            try:
                send(delivery)
            except DeliveryFailed as failed:
                if failed.rejected:
                    self._move_rejected(claimed, failed)
                    continue
                self._put_back(claimed, path, failed.remainder)
                if failed.transient:
                    break
                logger.error("sdc: spooled record %s refused: %s", path.name, failed.reason)
                continue
            except Exception:
                self._put_back(claimed, path, delivery)
                raise
            claimed.unlink(missing_ok=True)
            sent += 1
        return sent, len(self.records())

    def _log_refusal(self, problem: str) -> None:
        if self._refusal_logged:
            return
        self._refusal_logged = True
        logger.error(
            "sdc: spool directory %s %s; not using it (spooling is off: an alarm that cannot be "
            "sent is logged whole instead). Give the job a directory of its own with mode 0700 "
            "(SDC_SPOOL_DIR).",
            self.directory,
            problem,
        )

    def _set_aside_foreign(self, claimed: Path, why: str) -> None:
        """Keep a record addressed to another job aside, unsent and undeleted, and say so."""
        foreign = claimed.with_name(_original_name(claimed) + FOREIGN)
        try:
            os.rename(claimed, foreign)
        except OSError:
            foreign = claimed  # still claimed: reclaimed as stale later, and set aside again
        logger.error(
            "sdc: spool record %s is not addressed to this job (%s); kept unsent as %s",
            claimed,
            why,
            foreign,
        )

    def _move_rejected(self, claimed: Path, failed: DeliveryFailed) -> None:
        name = _original_name(claimed)
        if failed.remainder.done:
            claimed.unlink(missing_ok=True)
            return
        line = json.dumps(failed.remainder.to_record(), separators=(",", ":")) + "\n"
        try:
            self._keep_rejected(name, line.encode(), failed.reason, failed.remainder.kind)
            claimed.unlink(missing_ok=True)
        except OSError as exc:
            # Leave the claimed file: it is reclaimed as stale later, never lost.
            logger.error("sdc: cannot move %s to %s: %s", claimed, self.rejected_directory, exc)

    def _keep_rejected(self, name: str, data: bytes, reason: str, kind: str) -> None:
        self.rejected_directory.mkdir(mode=0o700, exist_ok=True)
        target = self.rejected_directory / name
        self._write_atomic(target.with_name(name + REASON), (reason + "\n").encode())
        self._write_atomic(target, data)
        logger.error(
            "sdc: AWS rejected the %s as invalid (%s); kept as %s, never sent again",
            kind,
            reason,
            target,
        )

    def _put_back(self, claimed: Path, path: Path, remainder: Delivery) -> None:
        if remainder.done:
            claimed.unlink(missing_ok=True)
            return
        line = json.dumps(remainder.to_record(), separators=(",", ":")) + "\n"
        try:
            self._write_atomic(path, line.encode())
            claimed.unlink(missing_ok=True)
        except OSError as exc:
            # Leave the claimed file: it is reclaimed as stale later, never lost.
            logger.error("sdc: cannot return %s to the spool: %s", claimed, exc)

    def _quarantine(self, claimed: Path, exc: Exception) -> None:
        """Keep an unreadable record aside (never re-sent, never deleted) and say so loudly."""
        try:
            raw = claimed.read_text(errors="replace")
        except OSError:
            raw = "<unreadable>"
        bad = claimed.with_name(_original_name(claimed) + BAD)
        try:
            os.rename(claimed, bad)
        except OSError:
            bad = claimed
        logger.error(
            "sdc: spool record %s is not valid (%s), kept as %s: %s", claimed, exc, bad, raw
        )

    def _reclaim_stale(self) -> None:
        now = time.time()
        for claimed in self.directory.glob(f"sdc-*{SUFFIX}.*{CLAIMED}"):
            try:
                claimed_at = int(claimed.name.removesuffix(CLAIMED).rsplit(".", 1)[1])
            except ValueError:
                claimed_at = 0
            if now - claimed_at > STALE_CLAIM_SECONDS:
                try:
                    os.rename(claimed, claimed.with_name(_original_name(claimed)))
                except OSError:
                    continue

    @staticmethod
    def _write_atomic(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def _new_name() -> str:
    """A record's file name: sorts by creation time, unique across processes."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    return f"sdc-{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"


def _original_name(claimed: Path) -> str:
    """``sdc-....jsonl`` from its claimed name ``sdc-....jsonl.<epoch>.sending``."""
    return claimed.name.split(SUFFIX, 1)[0] + SUFFIX
