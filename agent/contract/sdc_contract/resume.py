"""Where a job may resume after an SDC alarm: the rule, on one ``sdc.alarm/v1`` report.

A persistent fault that started at step 250 and was caught by the audit at step 300 has put every
update in between into every replica (the all-reduce spreads it; the replicas still agree), so
every checkpoint saved in between passes its weight check and is still corrupted. The job must
resume from a checkpoint saved before the fault could have started. The rule, per check, is in
:func:`resume_rule` and explained in docs/recovery.md.

Conventions: a checkpoint "at step s" holds the weights after step s's update (the guard calls
``save_checkpoint(s, tags)`` after that update), and a run resumed from it starts at step s + 1
(``guard.train(..., start_step=s + 1)``).

One rule for every part: the agent applies it to its alarm log (``sdc_agent.recovery``, which
re-exports these names) and the remediation pipeline states it in every message that tells a
person where to resume, from the same report fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .errors import SdcAgentError


class AlarmLogError(SdcAgentError, ValueError):
    """An alarm cannot be read: a report field the rule needs is missing or malformed, or (in
    the agent's alarm log) the directory is missing or a file is not a valid record."""


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
    check, step = alarm_field(alarm, "check", str), alarm_field(alarm, "step", int)
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
    return lowest_suspect <= checkpoint_step <= alarm_field(alarm, "step", int)


# ---------------------------------------------------------------------------------- helpers
def alarm_field(alarm: Mapping[str, Any], name: str, kind: type) -> Any:
    """``alarm[name]``, checked to be a ``kind`` (AlarmLogError naming the field otherwise)."""
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


__all__ = ["AlarmLogError", "ResumeRule", "alarm_field", "covers", "resume_rule"]
