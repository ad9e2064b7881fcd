"""What humans read: the evidence of a suspect, the suggested action, and the SNS messages."""

from __future__ import annotations

import json
from typing import Any

from . import aws
from .models import HealthResult, ItemState, RecordInput

# Paraphrased from the approach of the AWS ML blog post "Detecting and recovering from silent data
# corruption on Amazon SageMaker HyperPod" (DESIGN.md): what to do about the job, per alarm type.
SUGGESTED_ACTIONS = {
    "nonfinite": (
        "The step with the non-finite gradient was not applied, so the model is intact. Keep the "
        "job running without this node; replace the GPU if the deep health check fails or the "
        "node is named again."
    ),
    "compute": (
        "The mismatching step was not applied, so the weights are intact. Checkpoints up to "
        "last_audit_pass are trustworthy. Replace the node if the verdict is 'persistent' or the "
        "node is a repeat offender; a 'transient' verdict with a passed health check may be "
        "released and watched."
    ),
    "weights": (
        "Replicas diverged: do not resume from any checkpoint written after "
        "last_weight_check_pass. Restart from the last checkpoint at or before it, without this "
        "node, and replace the node."
    ),
    "reduced_gradient": (
        "The reduced gradient was non-finite and no rank could be named; the step was skipped. "
        "Watch for a repeat; a named rank will follow if a GPU is at fault."
    ),
}


def suggested_action(check: str, verdict: str) -> str:
    """The blog's suggested action for an alarm type (non-finite gradients have their own)."""
    if check == "compute" and verdict == "nonfinite":
        return SUGGESTED_ACTIONS["nonfinite"]
    return SUGGESTED_ACTIONS.get(check, "Inspect the report and the node before deciding.")


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
        "health_check": None
        if health is None
        else {"status": health.status, "detail": health.detail},
        "previous_remediations": history,
        "suggested_action": suggested_action(s.check, s.verdict),
        "remediation_id": state.admission.remediation_id if state.admission else None,
        "execution": state.execution,
    }


def approval_message(approval_id: str, ev: dict[str, Any], cli_prefix: str) -> tuple[str, str]:
    """Subject and body of the approval request. The task token is never part of it."""
    subject = f"[sdc-guard] approve replacing {ev['node_name']}? ({ev['check']}, {ev['verdict']})"
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
        f"Health check:   {health['status']} {health['detail']}".rstrip(),
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
        f"Suggested action: {ev['suggested_action']}",
        "",
        "To approve the replacement:",
        f"  {cli_prefix} approve {approval_id} --reason '...'",
        "To reject and keep the node cordoned (add --release to uncordon it):",
        f"  {cli_prefix} reject {approval_id} --reason '...'",
        f"To list pending approvals: {cli_prefix} pending",
    ]
    return subject[:100], "\n".join(lines)


def transition_message(inp: RecordInput, cluster: str) -> tuple[str, str]:
    """Subject and body of a notification for a recorded transition."""
    st = inp.state
    who = st.suspect.node_name if st.suspect else f"cluster {cluster}"
    subject = f"[sdc-guard] {inp.transition}: {who}"
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
        body["suggested_action"] = suggested_action(st.suspect.check, st.suspect.verdict)
    if st.suspects:
        body["suspects"] = [s.node_name for s in st.suspects]
    for key in ("admission", "cordon", "health", "approval", "replacement", "uncordon"):
        value = getattr(st, key)
        if value is not None:
            body[key] = value.model_dump(by_alias=True)
    if inp.error:
        body["error"] = {"Error": inp.error.error, "Cause": inp.error.cause[:2000]}
    return subject[:100], json.dumps(body, indent=2, default=str)


def publish(topic_arn: str, subject: str, message: str) -> str:
    """Publish to the SNS topic; returns the message id."""
    sns = aws.client("sns")
    with aws.aws_errors("sns:Publish"):
        return sns.publish(TopicArn=topic_arn, Subject=subject, Message=message)["MessageId"]
