"""The local spool: alarms (and rank maps) that could not be sent yet, kept on disk as JSONL.

One record per file (``sdc-<utc time>-<pid>-<id>.jsonl``, one JSON line each), written by
write-then-rename. That keeps the spool safe without locks when several processes share it (two
jobs on a node, or a restarted pod on a hostPath volume): a writer never blocks on another
process, a crash never leaves half a record, and a drainer claims a record by renaming it, so
two drainers never send the same record. ``cat $SDC_SPOOL_DIR/*.jsonl`` reads it as one JSONL
stream.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from .events import Delivery

logger = logging.getLogger(__name__)

SUFFIX = ".jsonl"
CLAIMED = ".sending"
BAD = ".bad"
# A record claimed this long ago by a drainer that never finished (it died) is reclaimed.
STALE_CLAIM_SECONDS = 600.0


class DeliveryFailed(Exception):
    """A delivery could not be completed; ``remainder`` is what is still to send.

    ``transient`` says whether AWS was out of reach (network, throttling, 5xx) rather than
    refusing this one request (permissions, validation).
    """

    def __init__(self, remainder: Delivery, reason: str, *, transient: bool = True) -> None:
        super().__init__(reason)
        self.remainder = remainder
        self.reason = reason
        self.transient = transient


class Spool:
    """A directory of spooled deliveries with a size limit."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    def put(self, delivery: Delivery) -> bool:
        """Store one delivery; False (never an exception) when the spool is full or unwritable."""
        line = json.dumps(delivery.to_record(), separators=(",", ":")) + "\n"
        data = line.encode()
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.size_bytes() + len(data) > self.max_bytes:
                logger.error(
                    "sdc: spool %s is full (%d bytes allowed)", self.directory, self.max_bytes
                )
                return False
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            name = f"sdc-{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}"
            self._write_atomic(self.directory / name, data)
        except OSError as exc:
            logger.error("sdc: cannot write to spool %s: %s", self.directory, exc)
            return False
        return True

    def records(self) -> list[Path]:
        """Spooled records not being sent right now, oldest first."""
        try:
            return sorted(self.directory.glob(f"sdc-*{SUFFIX}"))
        except OSError:
            return []

    def size_bytes(self) -> int:
        """Bytes held by spooled and claimed records."""
        total = 0
        for path in self.directory.glob("sdc-*"):
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
        failure stops the drain (AWS is out of reach again); a record AWS refuses is kept and
        the drain goes on, so one bad record cannot hold back the others.
        """
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
            try:
                send(delivery)
            except DeliveryFailed as failed:
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


def _original_name(claimed: Path) -> str:
    """``sdc-....jsonl`` from its claimed name ``sdc-....jsonl.<epoch>.sending``."""
    return claimed.name.split(SUFFIX, 1)[0] + SUFFIX
