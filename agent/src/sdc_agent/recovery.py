"""The alarm log next to the checkpoints, and which checkpoint a job may resume from.

The rule itself (which steps one alarm makes suspect) is the contract's
(``sdc_contract.resume``: :func:`resume_rule`, :func:`covers`), shared with the remediation
pipeline; this module applies it to the alarms a guard recorded in ``alarm_dir`` (one file per
alarm, schema ``sdc.alarm-record/v1``) and re-exports it, so ``sdc_agent.recovery`` keeps every
name it had. docs/recovery.md explains both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sdc_contract.errors import SdcAgentError
from sdc_contract.report import ALARM_RECORD_SCHEMA
from sdc_contract.resume import AlarmLogError, ResumeRule, alarm_field, covers, resume_rule

logger = logging.getLogger("sdc_agent")

RECORD_SCHEMA = ALARM_RECORD_SCHEMA
"""Schema of one file of the alarm log: ``{"schema", "recorded_at", "writer_rank", "alarm",
"resume"}`` where ``alarm`` is the ``sdc.alarm/v1`` report and ``resume`` the rule's answer."""
RECORD_PREFIX = "alarm-"
RECORD_SUFFIX = ".json"


class UnsafeResumeError(SdcAgentError, RuntimeError):
    """A resume from a checkpoint that a recorded alarm's suspect window covers was refused."""


# ---------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class AlarmRecord:
    """One alarm of the log: the report and the file it was read from."""

    path: Path
    alarm: Mapping[str, Any]

    def describe(self) -> str:
        """``compute alarm of step 10 (suspect window [5, 10], <file>)``."""
        window = self.alarm.get("suspect_window")
        return (
            f"{self.alarm['check']} alarm of step {self.alarm['step']} "
            f"(suspect window {list(window) if window else None}, {self.path})"
        )


@dataclass(frozen=True)
class ResumeDecision:
    """The outcome of :func:`explain_resume`.

    ``step``: the checkpoint to resume from (None: none qualifies). ``reason``: why, in a
    sentence. ``refused``: each newer checkpoint that was refused, with the alarm that covers it.
    """

    step: int | None
    reason: str
    refused: dict[int, str] = field(default_factory=dict)
    alarms: list[AlarmRecord] = field(default_factory=list)


def decide_resume(
    checkpoint_steps: Iterable[int], records: Sequence[AlarmRecord]
) -> ResumeDecision:
    """The newest checkpoint no alarm covers, from alarms already read (no I/O)."""
    steps = sorted(set(_checkpoint_steps(checkpoint_steps)), reverse=True)
    refused: dict[int, str] = {}
    for step in steps:
        covering = [r for r in records if covers(r.alarm, step)]
        if not covering:
            if refused:
                reason = f"step {step} is the newest checkpoint no recorded alarm covers"
            elif records:
                reason = f"step {step} is the newest checkpoint; no recorded alarm covers it"
            else:
                reason = f"step {step} is the newest checkpoint; no alarm is recorded"
            return ResumeDecision(step, reason, refused, list(records))
        refused[step] = "; ".join(
            f"{r.describe()}: {resume_rule(r.alarm).sentence}" for r in covering
        )
    if not steps:
        reason = "there is no checkpoint to resume from"
    else:
        reason = (
            f"every checkpoint ({', '.join(map(str, steps))}) is covered by a recorded alarm's "
            "suspect window: restart from the initial weights (or resume with "
            "allow_unsafe_resume=True for forensics only)"
        )
    return ResumeDecision(None, reason, refused, list(records))


def explain_resume(checkpoint_steps: Iterable[int], alarm_dir: str | os.PathLike) -> ResumeDecision:
    """Which of ``checkpoint_steps`` a job may resume from given the alarm log in ``alarm_dir``,
    with the reason and every refused checkpoint. Raises AlarmLogError for a missing directory or
    a malformed record (naming the file)."""
    return decide_resume(checkpoint_steps, read_alarm_log(alarm_dir))


def clean_resume_step(checkpoint_steps: Iterable[int], alarm_dir: str | os.PathLike) -> int | None:
    """The newest of ``checkpoint_steps`` that no alarm recorded in ``alarm_dir`` covers.

    A checkpoint "at step s" is the one saved after step s's update; resume it with
    ``guard.train(..., start_step=s + 1)``. Returns None when none qualifies, after logging why
    (:func:`explain_resume` returns the reasoning). Raises AlarmLogError when the directory does
    not exist (a wrong path would hide every alarm) or holds a malformed record. The rule:
    :func:`resume_rule`, docs/recovery.md.
    """
    decision = explain_resume(checkpoint_steps, alarm_dir)
    if decision.step is None:
        logger.warning("sdc_agent: no clean checkpoint to resume from: %s", decision.reason)
    return decision.step


def resume_refusal(start_step: int, records: Sequence[AlarmRecord]) -> str | None:
    """Why a run starting at ``start_step`` (from the checkpoint at ``start_step - 1``) must not
    start, naming the alarm and the newest clean step; None when it may.

    The newest clean step is a bound, not a checkpoint: the job may have saved none at that
    step (checkpoints every 10 steps, a window from step 20: 19 is the one to load, not 20).
    The guard that refuses does not know which checkpoints exist, so the message says how to
    find the one to load (:func:`clean_resume_step` over the saved steps) instead of naming one.
    """
    if start_step <= 0:
        return None  # the initial weights: nothing of this job's history is in them
    loaded = start_step - 1
    covering = [r for r in records if covers(r.alarm, loaded)]
    if not covering:
        return None
    clean: int | None = loaded
    while clean is not None and (blocking := [r for r in records if covers(r.alarm, clean)]):
        bounds = [resume_rule(r.alarm).max_step for r in blocking]
        clean = None if any(b is None for b in bounds) else min(b for b in bounds if b is not None)
    newest = (
        f"resume from the newest checkpoint at or before step {clean} "
        f"(train(..., start_step={clean + 1})) if you saved one at step {clean}; else from the "
        f"newest you saved before step {clean}, with start_step one past its step: "
        "sdc.clean_resume_step(<the saved checkpoints' steps>, alarm_dir) names it"
        if clean is not None
        else "no checkpoint of this job is clean: restart from the initial weights"
    )
    return (
        f"sdc_agent: refusing to resume from the checkpoint of step {loaded} "
        f"(start_step={start_step}): it lies in the suspect window of "
        + "; ".join(r.describe() for r in covering)
        + f", so it may hold corrupted updates; {newest}. See docs/recovery.md; "
        "allow_unsafe_resume=True overrides this for forensics only."
    )


# ---------------------------------------------------------------------------------- the log
def record_name(alarm: Mapping[str, Any], writer_rank: int) -> str:
    """The file name of an alarm's record: the same alarm always gets the same name, so a
    re-write is idempotent; the writer's rank keeps several data-parallel groups apart."""
    step, check = alarm_field(alarm, "step", int), alarm_field(alarm, "check", str)
    return f"{RECORD_PREFIX}step{step:010d}-{check}-rank{writer_rank}{RECORD_SUFFIX}"


def write_alarm_record(
    alarm_dir: str | os.PathLike, alarm: Mapping[str, Any], *, writer_rank: int
) -> Path:
    """Write one alarm to the log, atomically, once; returns its path. Raises OSError.

    One file per alarm, not a shared JSONL: the log lives next to the checkpoints on FSx for
    Lustre or an S3 mount, and Mountpoint for S3 can neither append to an object nor rename one
    on a general-purpose bucket, while every POSIX file system can rename. So the record is
    written to a hidden temporary name and renamed into place (atomic on POSIX: a reader sees
    the whole record or none); where rename is not supported it is written directly under its
    final name, which on an S3 mount is atomic too (the object appears when the file is closed).
    A record that already exists is left alone: the same alarm is recorded once.
    """
    directory = Path(alarm_dir)
    final = directory / record_name(alarm, writer_rank)
    if final.exists():
        return final
    rule = resume_rule(alarm)
    text = json.dumps(
        {
            "schema": RECORD_SCHEMA,
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "writer_rank": writer_rank,
            "alarm": dict(alarm),
            "resume": {"max_step": rule.max_step, "sentence": rule.sentence, "reason": rule.reason},
        },
        indent=1,
        sort_keys=True,
    )
    temporary = directory / f".{final.name}.{os.getpid()}.tmp"
    _write_file(temporary, text)
    try:
        os.replace(temporary, final)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        _write_file(final, text)
    _sync_directory(directory)
    return final


def probe_writable(alarm_dir: str | os.PathLike) -> str | None:
    """Create ``alarm_dir`` if needed and write a hidden probe file to it; None when that worked,
    else the reason (for a clear error at the guard's construction)."""
    directory = Path(alarm_dir)
    probe = directory / f".sdc-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write_file(probe, "sdc_agent write probe\n")
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    with contextlib.suppress(OSError):  # an S3 mount without --allow-delete keeps it: harmless
        probe.unlink()
    return None


def read_alarm_log(alarm_dir: str | os.PathLike) -> list[AlarmRecord]:
    """Every alarm recorded in ``alarm_dir``, oldest step first.

    Raises AlarmLogError when the directory does not exist or a record is malformed (naming the
    file). Hidden files (temporaries, probes) are not records.
    """
    directory = Path(alarm_dir)
    if not directory.is_dir():
        raise AlarmLogError(
            f"alarm log directory {str(directory)!r} does not exist; the guard creates it when "
            "built with alarm_dir=..., and a wrong path would hide every recorded alarm"
        )
    records = []
    for path in sorted(directory.glob(f"{RECORD_PREFIX}*{RECORD_SUFFIX}")):
        records.append(AlarmRecord(path, _parse_record(path)))
    return sorted(records, key=lambda r: (r.alarm["step"], str(r.path)))


def _parse_record(path: Path) -> Mapping[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AlarmLogError(f"alarm record {path} cannot be read as JSON: {err}") from err
    if not isinstance(record, dict) or record.get("schema") != RECORD_SCHEMA:
        raise AlarmLogError(f"alarm record {path} is not an {RECORD_SCHEMA} record")
    alarm = record.get("alarm")
    if not isinstance(alarm, dict):
        raise AlarmLogError(f"alarm record {path} has no 'alarm' object")
    try:
        resume_rule(alarm)  # validates every field the rule reads
    except AlarmLogError as err:
        raise AlarmLogError(f"alarm record {path} is malformed: {err}") from err
    return alarm


# ---------------------------------------------------------------------------------- helpers
def _checkpoint_steps(steps: Iterable[int]) -> list[int]:
    out = []
    for step in steps:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"checkpoint_steps must be integers >= 0, got {step!r}")
        out.append(step)
    return out


def _write_file(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_directory(directory: Path) -> None:
    """Make the rename durable where the file system supports it (not every mount does)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = [
    "RECORD_SCHEMA",
    "AlarmLogError",
    "AlarmRecord",
    "ResumeDecision",
    "ResumeRule",
    "UnsafeResumeError",
    "clean_resume_step",
    "covers",
    "decide_resume",
    "explain_resume",
    "probe_writable",
    "read_alarm_log",
    "record_name",
    "resume_refusal",
    "resume_rule",
    "write_alarm_record",
]
