"""Where a job may resume after an SDC alarm: the rule, and the alarm log next to the checkpoints.

A persistent fault that started at step 250 and was caught by the audit at step 300 has put every
update in between into every replica (the all-reduce spreads it; the replicas still agree), so
every checkpoint saved in between passes its weight check and is still corrupted. The job must
resume from a checkpoint saved before the fault could have started. The rule, per check, is in
:func:`resume_rule` and explained in docs/recovery.md.

Conventions: a checkpoint "at step s" holds the weights after step s's update (the guard calls
``save_checkpoint(s, tags)`` after that update), and a run resumed from it starts at step s + 1
(``guard.train(..., start_step=s + 1)``).

This module imports nothing but the standard library and nothing of its own package, so the
remediation pipeline, which cannot import torch, states the same rule from the same source: it
loads this file by path (or ships a copy of it) and calls :func:`resume_rule` on the
``sdc.alarm/v1`` report it already holds::

    spec = importlib.util.spec_from_file_location("sdc_recovery", path_to_this_file)
    rule = sys.modules["sdc_recovery"] = importlib.util.module_from_spec(spec)  # dataclasses
    spec.loader.exec_module(rule)                                                # need it there
    rule.resume_rule(report).sentence   # "resume from the newest checkpoint at or before step N"
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
from typing import Any, NamedTuple

logger = logging.getLogger("sdc_agent")

RECORD_SCHEMA = "sdc.alarm-record/v1"
"""Schema of one file of the alarm log: ``{"schema", "recorded_at", "writer_rank", "alarm",
"resume"}`` where ``alarm`` is the ``sdc.alarm/v1`` report and ``resume`` this module's rule."""
RECORD_PREFIX = "alarm-"
RECORD_SUFFIX = ".json"


class AlarmLogError(ValueError):
    """The alarm log cannot be read (missing directory, or a file that is not a valid record)."""


class UnsafeResumeError(RuntimeError):
    """A resume from a checkpoint that a recorded alarm's suspect window covers was refused."""


# ---------------------------------------------------------------------------------- the rule
class ResumeRule(NamedTuple):
    """What one alarm allows: resume from a checkpoint at or before ``max_step``.

    ``max_step`` is None when no checkpoint can be shown clean (restart from the initial weights).
    ``sentence`` is the instruction to give a person, ``reason`` why it is that step.
    """

    max_step: int | None
    sentence: str
    reason: str


def resume_rule(alarm: Mapping[str, Any]) -> ResumeRule:
    """The newest checkpoint step one ``sdc.alarm/v1`` report leaves clean, and why.

    With suspect window ``[first, last]`` (``last`` = the alarm's step), the step ``first`` is
    the one the check that fired last verified, so the state after its update is clean, and every
    checkpoint saved after it, up to the alarm's step, is suspect. Per check:

    - ``compute``, the audit's mismatch: ``first`` is ``last_audit_pass``; there every rank's
      gradient of step ``first`` was reproduced bit for bit on another GPU and then applied.
      Clean: at or before ``last_audit_pass``.
    - ``compute`` with ``nonfinite`` ranks, and ``reduced_gradient``: check 1 verifies only that
      gradients were finite; a fault that ends in a NaN may have computed wrong finite values
      before. Clean: at or before the last audit pass (for ``reduced_gradient``, which names no
      rank and may also be a corruption after the all-reduce, the older of the last audit pass
      and the last weight check pass); without audits, finiteness is all that was verified, and
      the window's ``first`` - 1 is used.
    - ``weights``: ``first`` is ``last_weight_check_pass``; there every replica held
      bit-identical weights after step ``first``'s update (before a checkpoint, that is the check
      the checkpoint was saved under). Clean: at or before it.

    When the check that fired never passed in that run, ``first`` is the run's first step, which
    nothing verified: clean is at or before ``first`` - 1, the checkpoint the run resumed from.
    An alarm with neither a window nor a pass rules out nothing before its step (None).
    """
    check, step = _field(alarm, "check", str), _field(alarm, "step", int)
    first = _window_first(alarm)
    audit = _optional_int(alarm, "last_audit_pass")
    weights = _optional_int(alarm, "last_weight_check_pass")
    if check == "weights":
        evidence = weights
        why = "every replica's weights were bit-identical after step {n}'s update"
    elif check == "compute" and not alarm.get("nonfinite"):
        evidence = audit
        why = "the ring replay audit reproduced every rank's gradient of step {n} bit for bit"
    elif check in ("compute", "reduced_gradient"):
        passes = [audit] if check == "compute" else [audit, weights]
        known = [p for p in passes if p is not None]
        evidence = min(known) if known else None
        why = (
            "a non-finite gradient proves only that the fault ended in a NaN; step {n} is the "
            "last whose computation a check verified (a finite gradient is not a correct one)"
        )
    else:
        raise AlarmLogError(f"unknown check {check!r} in alarm of step {step}")

    if evidence is not None:
        bound = evidence if first is None else min(evidence, first)
    elif first is not None:
        bound = first - 1
        why = (
            "no check of this kind passed in that run, so its window starts at the run's first "
            "step {first}, which nothing verified; step {n} is the checkpoint the run started from"
        )
    else:
        return ResumeRule(
            None,
            "resume from no checkpoint of this job: restart from the initial weights",
            f"the {check} alarm of step {step} has no suspect window and no passing check, so "
            "nothing before it can be ruled out",
        )
    bound = min(bound, step - 1)  # the alarm's own step never passed its check
    if bound < 0:
        return ResumeRule(
            None,
            "resume from no checkpoint of this job: restart from the initial weights",
            f"the {check} alarm of step {step} leaves no step before its window verified",
        )
    return ResumeRule(
        bound,
        f"resume from the newest checkpoint at or before step {bound}",
        why.format(n=bound, first=first),
    )


def covers(alarm: Mapping[str, Any], checkpoint_step: int) -> bool:
    """Whether ``alarm`` makes the checkpoint saved after ``checkpoint_step``'s update suspect.

    Covered: the steps after :func:`resume_rule`'s ``max_step`` up to the alarm's step. A
    checkpoint after the alarm's step can only come from a run that resumed from a clean one
    (the guard stops at an alarm and refuses to resume inside a window), so it is not covered.
    """
    rule = resume_rule(alarm)
    lowest_suspect = 0 if rule.max_step is None else rule.max_step + 1
    return lowest_suspect <= checkpoint_step <= _field(alarm, "step", int)


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
    start, naming the alarm and the newest clean step; None when it may."""
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
        f"(train(..., start_step={clean + 1}))"
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
    step, check = _field(alarm, "step", int), _field(alarm, "check", str)
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
def _field(alarm: Mapping[str, Any], name: str, kind: type) -> Any:
    value = alarm.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise AlarmLogError(f"alarm field {name!r} must be of type {kind.__name__}, got {value!r}")
    return value


def _optional_int(alarm: Mapping[str, Any], name: str) -> int | None:
    value = alarm.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise AlarmLogError(f"alarm field {name!r} must be an integer or null, got {value!r}")
    return value


def _window_first(alarm: Mapping[str, Any]) -> int | None:
    """The window's first step; None when the alarm has no window."""
    window = alarm.get("suspect_window")
    if window is None or (isinstance(window, Sequence) and len(window) == 0):
        return None
    if (
        not isinstance(window, Sequence)
        or isinstance(window, str)
        or len(window) != 2
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in window)
        or window[0] > window[1]
    ):
        raise AlarmLogError(f"alarm field 'suspect_window' must be [first, last], got {window!r}")
    return window[0]


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
