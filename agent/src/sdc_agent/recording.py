"""The guard's alarm log: every alarm it returns, recorded next to the checkpoints, and the check
that a resumed run does not start inside a recorded alarm's suspect window.

The file format and the rule are in :mod:`sdc_agent.recovery` (no torch there, so the remediation
pipeline shares them); this module adds what needs the process group. Only DP rank 0 writes (the
alarm is identical on every rank, so one writer means no race), and every decision another rank
acts on is made once, on DP rank 0, and sent to the others, so every rank raises alike and none
is left waiting in a collective.
"""

from __future__ import annotations

import json
import logging
import os

import torch
import torch.distributed as dist

from .alarm import Alarm
from .recovery import (
    AlarmLogError,
    UnsafeResumeError,
    probe_writable,
    read_alarm_log,
    resume_refusal,
    resume_rule,
    write_alarm_record,
)
from .topology import all_gather_text, collective_device

logger = logging.getLogger("sdc_agent")


class NullAlarmLog:
    """No alarm log (``alarm_dir=None``): records nothing, refuses no resume."""

    def record(self, alarm: Alarm) -> None:
        """Do nothing."""

    def check_resume(self, start_step: int, *, allow_unsafe: bool) -> None:
        """Do nothing: without an alarm log there is nothing to check against."""


class AlarmLog:
    """The alarm log in ``alarm_dir`` for one guard. Build it with :func:`open_alarm_log`."""

    def __init__(
        self,
        alarm_dir: str | os.PathLike,
        dp_group: dist.ProcessGroup | None,
        *,
        writes: bool,
        writer_rank: int,
    ) -> None:
        """``writes``: this rank writes and reads the log (DP rank 0); ``writer_rank``: its
        global rank, in the record's name (several DP groups write apart)."""
        self.alarm_dir = os.fspath(alarm_dir)
        self.dp_group = dp_group
        self.writes = writes
        self.writer_rank = writer_rank

    def record(self, alarm: Alarm) -> None:
        """Write ``alarm`` to the log (DP rank 0; atomic, once per alarm), then wait until it is
        written on every rank (collective: every rank records the same alarm at the same point).

        The wait matters: a rank that returned the alarm first would exit (exit code 3), and
        torchrun then terminates the other workers, DP rank 0 too, perhaps mid-write. Never
        raises on a failed write: it is logged with the whole report, and every rank still gets
        the alarm.
        """
        if self.writes:
            self.write(alarm)
        done = torch.zeros(1, dtype=torch.int64, device=collective_device(self.dp_group))
        dist.all_reduce(done, group=self.dp_group)

    def write(self, alarm: Alarm) -> None:
        """Write ``alarm`` to the log from this rank, now (no collective); never raises."""
        report = alarm.to_dict()
        try:
            path = write_alarm_record(self.alarm_dir, report, writer_rank=self.writer_rank)
        except Exception:
            logger.exception(
                "sdc_agent: ALARM NOT RECORDED: writing the alarm of step %d to the alarm log %s "
                "failed; a resume cannot see it, so choose the checkpoint by hand: %s "
                "(report: %s)",
                alarm.step,
                self.alarm_dir,
                _rule_for_a_person(report),
                json.dumps(report, sort_keys=True),
            )
            return
        logger.info("sdc_agent: alarm of step %d recorded in %s", alarm.step, path)

    def check_resume(self, start_step: int, *, allow_unsafe: bool) -> None:
        """Refuse (UnsafeResumeError, on every rank) to start at ``start_step``, i.e. from the
        checkpoint of step ``start_step - 1``, when a recorded alarm's window covers it.

        Collective over the DP group: DP rank 0 reads the log and decides; every rank acts on
        that decision. A log that is malformed or cannot be read raises AlarmLogError on every rank. With ``allow_unsafe``
        the resume goes ahead, logged as an error.
        """
        verdict: dict[str, str | None] = {"refusal": None, "error": None}
        if self.writes:
            try:
                verdict["refusal"] = resume_refusal(start_step, read_alarm_log(self.alarm_dir))
            except AlarmLogError as err:
                verdict["error"] = str(err)
            except Exception as err:  # e.g. the directory cannot be listed: raise everywhere
                verdict["error"] = (
                    f"reading the alarm log {self.alarm_dir!r} failed: {type(err).__name__}: {err}"
                )
        decided = json.loads(
            all_gather_text(json.dumps(verdict) if self.writes else "-", self.dp_group)[0]
        )
        if decided["error"] is not None:
            raise AlarmLogError(decided["error"])
        refusal = decided["refusal"]
        if refusal is None:
            return
        if not allow_unsafe:
            raise UnsafeResumeError(refusal)
        if self.writes:
            logger.error(
                "sdc_agent: UNSAFE RESUME (allow_unsafe_resume=True, for forensics only): %s",
                refusal,
            )


def _rule_for_a_person(report: dict) -> str:
    """The resume rule for ``report``, as the pipeline's messages state it; never raises (it is
    called while reporting another failure)."""
    try:
        return resume_rule(report).sentence
    except Exception:  # a report the rule cannot read: the window is all there is to go on
        return (
            f"resume from a checkpoint before the suspect window {report.get('suspect_window')} "
            "(see docs/recovery.md)"
        )


def open_alarm_log(
    alarm_dir: str | os.PathLike | None, dp_group: dist.ProcessGroup | None, *, writes: bool
) -> AlarmLog | NullAlarmLog:
    """The alarm log for a guard; collective over the DP group when ``alarm_dir`` is set (pass the
    same value on every rank).

    DP rank 0 creates the directory and writes a probe file; when that fails every rank raises
    the same OSError naming the directory: the user asked for durable records, so training must
    not start without them.
    """
    if alarm_dir is None:
        return NullAlarmLog()
    # DP rank 0's verdict, the same text everywhere ("ok", never empty: gloo hangs on an
    # all-gather of empty tensors).
    local = (probe_writable(alarm_dir) or "ok") if writes else "-"
    problem = all_gather_text(local, dp_group)[0]
    if problem != "ok":
        raise OSError(
            f"sdc_agent: alarm_dir {os.fspath(alarm_dir)!r} is not writable from DP rank 0 "
            f"({problem}); the guard records every alarm there, next to the checkpoints, so "
            "that a resume can refuse a corrupted checkpoint"
        )
    return AlarmLog(alarm_dir, dp_group, writes=writes, writer_rank=dist.get_rank())
