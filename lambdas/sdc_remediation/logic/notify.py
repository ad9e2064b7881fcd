"""What humans read: the evidence of a suspect, the suggested action, and the SNS messages
(their text only: ``clients.sns`` sends them).

Every check and verdict these texts name is one of the contract's (``models.Suspect`` reads a
verdict outside the list as ``unknown``), so no free text from a report reaches a subject.
"""

from __future__ import annotations

import json
from typing import Any

from sdc_contract import resume

from ..models import HealthResult, ItemState, RecordInput, ScreenResult, Suspect
from .autoapprove import AutoDecision

# Paraphrased from the approach of the AWS ML blog post "Detecting and recovering from silent data
# corruption on Amazon SageMaker HyperPod": what to do about the job and the node, per alarm type.
# Where the job resumes is not in these texts: it is the agent's rule (``resume_rule_of``), stated
# next to them, because a fault older than the alarm's step has already reached every replica.
SUGGESTED_ACTIONS = {
    "nonfinite": (
        "The step with the non-finite gradient was not applied, but a fault that ends in a NaN "
        "may have computed wrong finite gradients before it, and those were applied on every "
        "replica: if the job restarts, follow the resume rule, never a later checkpoint. Keep the "
        "job running without this node; replace the GPU if the deep health check fails or the "
        "node is named again."
    ),
    "compute": (
        "The mismatching step was not applied, but a persistent fault may have corrupted every "
        "update since the last passing audit, in every replica (the all-reduce spreads it, so "
        "weight checks still pass): restart the job by the resume rule, never from a later "
        "checkpoint. Replace the node if the verdict is 'persistent' or the node is a repeat "
        "offender; a 'transient' verdict with a passed health check may be released and watched "
        "(the resume rule holds either way)."
    ),
    "weights": (
        "Replicas diverged: restart by the resume rule (at or before last_weight_check_pass, "
        "when every replica last held the same weights), without this node, and replace the node."
    ),
    "reduced_gradient": (
        "The reduced gradient was non-finite and no rank could be named; the step was skipped, "
        "but earlier updates may be wrong: if the job restarts, follow the resume rule. Watch for "
        "a repeat; a named rank will follow if a GPU is at fault."
    ),
}


def suggested_action(check: str, verdict: str) -> str:
    """The blog's suggested action for an alarm type (non-finite gradients have their own)."""
    if check == "compute" and verdict == "nonfinite":
        return SUGGESTED_ACTIONS["nonfinite"]
    return SUGGESTED_ACTIONS.get(check, "Inspect the report and the node before deciding.")


def resume_rule_of(suspect: Suspect) -> resume.ResumeRule:
    """Where the job may resume after the alarm that named ``suspect``: the contract's rule
    (``sdc_contract.resume``, the one the agent applies to its alarm log), on the fields the
    workflow state carries. ``nonfinite`` is given only as present or not: all the rule reads
    of it."""
    return resume.resume_rule(
        {
            "check": suspect.check,
            "step": suspect.step,
            "suspect_window": list(suspect.suspect_window),
            "last_audit_pass": suspect.last_audit_pass,
            "last_weight_check_pass": suspect.last_weight_check_pass,
            "nonfinite": [True] if suspect.nonfinite_count else [],
        }
    )


def resume_summary(suspect: Suspect) -> dict[str, Any]:
    """The resume rule as the messages and the ledger carry it: max_step, sentence, reason."""
    rule = resume_rule_of(suspect)
    return {"max_step": rule.max_step, "sentence": rule.sentence, "reason": rule.reason}


def report_reference(suspect: Suspect) -> str | None:
    """Where the full report is (every tensor, every rank): its CloudWatch Logs group/stream."""
    if not suspect.report_log_group:
        return None
    return f"{suspect.report_log_group}/{suspect.report_log_stream or '?'}"


def evidence(state: ItemState, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The evidence an approver needs, JSON-serialisable (stored with the approval)."""
    s, a = state.suspect, state.alarm
    health: HealthResult | None = state.health
    return {
        "alarm": a.alarm_name,
        "alarm_time": a.time,
        "reason": a.reason,
        "cluster": a.cluster_name,
        "job": s.job,
        "node_name": s.node_name,
        "instance_id": s.instance_id,
        "instance_group": s.instance_group,
        "check": s.check,
        "step": s.step,
        "verdict": s.verdict,
        "suspect_window": s.suspect_window,
        "last_audit_pass": s.last_audit_pass,
        "last_weight_check_pass": s.last_weight_check_pass,
        "ranks": {
            r: i.model_dump(exclude_none=True)
            for r, i in sorted(s.ranks.items(), key=lambda kv: int(kv[0]))
        },
        "divergent_tensors": s.divergent_tensors[:20],
        "divergent_tensor_count": s.divergent_tensor_count,
        "report": report_reference(s),
        "resume": resume_summary(s),
        "health_check": None
        if health is None
        else {"status": health.status, "detail": health.detail},
        "screen": screen_evidence(state.screen),
        "previous_remediations": history,
        "suggested_action": suggested_action(s.check, s.verdict),
        "remediation_id": state.admission.remediation_id if state.admission else None,
        "execution": state.execution,
    }


def screen_evidence(screen: ScreenResult | None) -> dict[str, Any] | None:
    """The node screen's outcome as the approval's evidence keeps it (None: no screen ran)."""
    if screen is None:
        return None
    return {
        "status": screen.status,
        "line": screen.line(),
        "gpu_index": screen.gpu_index,
        "gpu_uuid": screen.gpu_uuid,
        "ran": screen.ran,
        "reason": screen.reason,
        "job": screen.job,
    }


def screen_line(ev: dict[str, Any]) -> str:
    """``screen: reproduced on GPU 3 (UUID ...)`` / ``screen: clean (ran: ...)`` / ``screen:
    failed (reason)`` / ``screen: not configured ...``: the approval message's line. A clean
    screen is not an exoneration: the approver still decides on the job's evidence."""
    screen = ev.get("screen")
    return f"screen: {screen['line'] if screen else 'not run'}"


def subject_prefix(dry_run: bool) -> str:
    """Every notification starts with this; a dry run says so, so nobody acts on a rehearsal."""
    return "[sdc-guard dry-run]" if dry_run else "[sdc-guard]"


def approval_message(
    approval_id: str, ev: dict[str, Any], cli_prefix: str, *, dry_run: bool = False
) -> tuple[str, str]:
    """Subject and body of the approval request. The task token is never part of it."""
    subject = (
        f"{subject_prefix(dry_run)} approve replacing {ev['node_name']}? "
        f"({ev['check']}, {ev['verdict']})"
    )
    repeats = len(ev["previous_remediations"])
    health = ev["health_check"] or {"status": "not run", "detail": ""}
    lines = [
        f"sdc-guard cordoned {ev['node_name']} ({ev['instance_id']}, group {ev['instance_group']}) "
        f"in cluster {ev['cluster']} and asks for approval to replace it.",
        "",
        f"Alarm:          {ev['alarm']} at {ev['alarm_time']}",
        f"Job:            {ev['job']}",
        f"Check:          {ev['check']} at step {ev['step']}, verdict {ev['verdict']}",
        f"Suspect window: steps {ev['suspect_window'][0]}..{ev['suspect_window'][-1]} "
        f"(last audit pass {ev['last_audit_pass']}, last weight check pass {ev['last_weight_check_pass']})",
        "Ranks:          "
        + ", ".join(
            f"{r} (GPU {i.get('gpu_uuid')}, local {i.get('local_rank')})"
            for r, i in ev["ranks"].items()
        ),
        f"Divergent:      {_divergent(ev)}",
        f"Full report:    CloudWatch Logs {ev.get('report') or 'not recorded'}",
        f"Health check:   {health['status']} {health['detail']}".rstrip(),
        screen_line(ev),
        *_auto_approval_lines(ev),
        f"History:        {repeats} earlier remediation(s) of this instance"
        + (
            ": "
            + "; ".join(
                f"{h['first']} {'/'.join(h['transitions'])}" for h in ev["previous_remediations"]
            )
            if repeats
            else ""
        ),
        "",
        *_resume_lines(ev),
        f"Suggested action: {ev['suggested_action']}",
        "",
        "To approve the replacement:",
        f"  {cli_prefix} approve {approval_id} --reason '...'",
        "To reject and keep the node cordoned (add --release to uncordon it):",
        f"  {cli_prefix} reject {approval_id} --reason '...'",
        f"To list pending approvals: {cli_prefix} pending",
    ]
    return subject[:100], "\n".join(lines)


def _auto_approval_lines(ev: dict[str, Any]) -> list[str]:
    """Why the auto-approval policy left this one to a person (none without a policy)."""
    auto = ev.get("auto_approval")
    if not auto or auto.get("approve"):
        return []
    return [f"Auto-approval:  not applied: {auto.get('reason') or 'no rule applies'}"]


def _divergent(ev: dict[str, Any]) -> str:
    """How many tensors diverged, and the first few names (the full report has them all)."""
    names = ev.get("divergent_tensors") or []
    count = max(int(ev.get("divergent_tensor_count") or 0), len(names))
    if not count:
        return "no tensor named"
    shown = ", ".join(names)
    more = f" and {count - len(names)} more" if count > len(names) else ""
    return f"{count} tensor(s): {shown}{more}" if names else f"{count} tensor(s)"


def _resume_lines(ev: dict[str, Any]) -> list[str]:
    """The resume rule for this alarm, first thing after the evidence."""
    resume = ev.get("resume")
    if not resume:
        return []
    return [f"Resume rule: {resume['sentence']} ({resume['reason']}).", ""]


def transition_message(inp: RecordInput, cluster: str, *, dry_run: bool = False) -> tuple[str, str]:
    """Subject and body of a notification for a recorded transition."""
    st = inp.state
    who = st.suspect.node_name if st.suspect else f"cluster {cluster}"
    subject = f"{subject_prefix(dry_run)} {inp.transition}: {who}"
    body: dict[str, Any] = {
        "transition": inp.transition,
        "cluster": cluster,
        "execution": st.execution,
    }
    if st.alarm:
        body["alarm"] = {
            "name": st.alarm.alarm_name,
            "time": st.alarm.time,
            "reason": st.alarm.reason,
        }
    if st.suspect:
        body["suspect"] = st.suspect.model_dump(exclude_none=True)
        body["resume"] = resume_summary(st.suspect)
        body["suggested_action"] = suggested_action(st.suspect.check, st.suspect.verdict)
        body["report"] = report_reference(st.suspect)
    if st.suspects:
        body["suspects"] = [s.node_name for s in st.suspects]
    for key in ("admission", "cordon", "health", "screen", "approval", "replacement", "uncordon"):
        value = getattr(st, key)
        if value is not None:
            body[key] = value.model_dump(by_alias=True)
    if inp.error:
        body["error"] = {"Error": inp.error.error, "Cause": inp.error.cause[:2000]}
    return subject[:100], json.dumps(body, indent=2, default=str)


def refused_message(inp: RecordInput, cluster: str, *, dry_run: bool = False) -> tuple[str, str]:
    """Subject and body telling the on-call which reports or claims localize refused, and why
    (nothing acted on them; the alarm's other reports and nodes went on)."""
    st = inp.state
    count = max(st.refused_count, len(st.refused))
    job = st.alarm.job if st.alarm and st.alarm.job else None
    subject = f"{subject_prefix(dry_run)} refused: {count} untrusted claim(s)"
    if job:
        subject += f" of job {job}"
    body: dict[str, Any] = {
        "transition": "refused",
        "summary": (
            f"localize refused {count} report(s) or node claim(s) it could not verify; nothing "
            "was cordoned for them. Each names the field that did not hold. The alarm's other "
            "reports and nodes were handled as usual."
        ),
        "cluster": cluster,
        "execution": st.execution or inp.execution,
        "refused": [r.model_dump(exclude_none=True) for r in st.refused],
    }
    if count > len(st.refused):
        body["not_listed"] = count - len(st.refused)
    if st.alarm:
        body["alarm"] = {"name": st.alarm.alarm_name, "time": st.alarm.time, "job": job}
    return subject, json.dumps(body, indent=2, default=str)


def auto_approval_message(
    approval_id: str, auto: AutoDecision, ev: dict[str, Any], *, dry_run: bool = False
) -> tuple[str, str]:
    """Subject and body telling the on-call that the auto-approval policy approved a
    replacement and no person decided."""
    subject = (
        f"{subject_prefix(dry_run)} auto-approved replacing {ev['node_name']} "
        f"({ev['check']}, {ev['verdict']})"
    )
    body = "\n".join(
        [
            f"sdc-guard's auto-approval policy approved replacing {ev['node_name']} "
            f"({ev['instance_id']}) in cluster {ev['cluster']}; no person decided.",
            "",
            f"Approver recorded: {auto.approver}",
            f"Why: {auto.reason}",
            f"Health check: {(ev.get('health_check') or {}).get('status', 'not run')}",
            screen_line(ev),
            f"Job: {ev['job']}, check {ev['check']} at step {ev['step']}, verdict {ev['verdict']}",
            f"Resume rule: {(ev.get('resume') or {}).get('sentence', '-')}",
            f"Approval id: {approval_id} (the blast-radius guard admitted this node first)",
        ]
    )
    return subject[:100], body
