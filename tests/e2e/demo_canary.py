"""`make demo ARGS=--canary`: one live canary through the stand-ins, step by step.

The canary function starts a run as its EventBridge Scheduler schedule would (a synthetic report
and datum for the reserved canary job and node); the local alarm evaluator fires the canary's
SDC alarm and the rule starts the real workflow, whose real handlers localize the canary, admit
it without claiming a slot, and run cordon, the deep health check, the approval and replace in
dry run; request_approval asks the approve function to settle the canary's approval (the only
function that sends task results) and the record step closes the run. The demo then checks
what a canary must never do (touch a node, hold a guard slot, page anybody, count in `stats`)
and that its not-completed alarm stays OK, and prints what `sdc-remediation canary` shows.
"""

from __future__ import annotations

import json
import time
from typing import Any

import sdc_contract as contract
from sdc_remediation.dal import keys
from sdc_remediation.logic import outcomes
from tests.e2e.harness.canary import LocalCanary
from tests.e2e.harness.pipeline import LocalPipeline
from tests.e2e.harness.runtime import Invocation
from tests.e2e.scenario import local_cluster, operator

CANARY_FOLDERS_SHOWN = (
    "localize", "admit", "cordon", "start_health_check", "poll_health_check",
    "request_approval", "approve", "replace", "record",
)  # fmt: skip


def _line(call: Invocation) -> str | None:
    """What one step did for the canary (None: an in-progress poll, not worth a line)."""
    r: Any = call.result or {}
    if call.error:
        return f"{call.folder}: error {call.error}"
    if call.folder == "localize":
        (s,) = r.get("suspects") or [{}]
        return (
            f"localize: canary report accepted: {s.get('node_name')} (reserved, instance "
            f"{s.get('instance_id')}), run {s.get('canary_run')}"
        )
    if call.folder == "admit":
        return f"admit: {r.get('decision')}: {r.get('reason')}"
    if call.folder == "cordon":
        return f"cordon: {r.get('node_name')} [dry run: nothing sent to Kubernetes]"
    if call.folder == "start_health_check":
        return f"deep health check: {r.get('detail')}"
    if call.folder == "poll_health_check":
        return None if r.get("status") == "in_progress" else f"deep health check: {r.get('status')}"
    if call.folder == "request_approval":
        return "approval requested; settled through the approve function's URL (nobody paged)"
    if call.folder == "approve":
        # Reached through its URL: the result is the HTTP response, the decision its body.
        body = json.loads(r.get("body") or "{}") if isinstance(r, dict) else {}
        return (
            f"approve (canary, through its URL, HTTP {r.get('statusCode')}): "
            f"{body.get('decision')} recorded, approver {body.get('approver')}"
        )
    if call.folder == "replace":
        return f"replace: {r.get('detail')}"
    if call.folder == "record":
        return f"ledger: {call.payload.get('transition')} (canary: no notification)"
    return None


def run_canary(tl: Any) -> None:
    """One canary on a fresh local pipeline; failures go to ``tl.fail`` (the demo's Timeline)."""
    cluster = local_cluster(3)
    with LocalPipeline(cluster, quiet_handlers=True) as p:
        tl.say(
            f"stand-ins up: moto at {p.endpoint}, Kubernetes API at {p.kube.url}, HyperPod "
            f"cluster '{cluster.hyperpod_name}' with {len(cluster.instance_ids)} nodes; state "
            "machine and canary alarms from `cdk synth` (canarySchedule: 1 day)"
        )
        canary = LocalCanary(p)
        run = canary.start()
        tl.say(
            f"schedule -> canary function: run {run.run_id}: report for job {contract.CANARY_JOB} "
            f"on the reserved node {contract.CANARY_NODE_NAME} written to /sdc/"
            f"{cluster.hyperpod_name}, {contract.CANARY_METRIC} put on its own series"
        )
        fired = p.evaluator.evaluate()
        if not fired:
            tl.fail("the canary's SDC alarm did not fire")
            return
        (execution,) = p.executions
        tl.say(
            f"CloudWatch alarm {fired[0]['detail']['alarmName']} -> ALARM; EventBridge rule -> "
            f"workflow execution {execution.rsplit(':', 1)[-1]}"
        )
        done = p.finish(execution)
        calls = [c for c in p.invocations if c.folder in CANARY_FOLDERS_SHOWN]
        for call in sorted(calls, key=lambda c: c.started):
            line = _line(call)
            if line:
                tl.say(f"  {line} ({call.ended - call.started:.2f} s)", call.started)
        tl.say(
            f"workflow {done['status']}; ledger for the reserved node: "
            f"{' -> '.join(p.transitions(contract.CANARY_INSTANCE_ID))}"
        )
        _check(tl, p, canary, run, done)
        code, out = operator(p, "canary", "--cluster", cluster.hyperpod_name)
        tl.say("operator: $ sdc-remediation canary --cluster " + cluster.hyperpod_name)
        print("\n".join(f"          {line}" for line in out.splitlines()), flush=True)
        if code != 0:
            tl.fail(f"sdc-remediation canary exited {code}")


def _check(tl: Any, p: LocalPipeline, canary: LocalCanary, run: Any, done: dict) -> None:
    """What a canary must do (close itself) and must never do, each said or failed."""
    if done["status"] != "SUCCEEDED":
        tl.fail(f"the canary's execution ended {done['status']}")
    checks = {
        "nothing cordoned or patched in Kubernetes": p.kube.patches == [],
        "no HyperPod call (no health check started, no replacement)": p.hyperpod.calls == [],
        "no blast-radius slot held, no node claimed": not [
            i for i in p.ledger() if keys.is_state(i) or i.get("admissions") or i.get("held")
        ],
        "nobody paged": p.notifications() == [],
        "stats see no remediation": outcomes.summarise(p.ledger()) == [],
        "canary_completed put (the not-completed alarm stays OK)": canary.evaluate(run.started)
        is None,
    }
    for what, ok in checks.items():
        if ok:
            tl.say(f"  canary: {what}")
        else:
            tl.fail(f"canary: not true: {what}")
    tl.say(f"canary closed itself {time.time() - tl.t0:.1f} s after the demo started")
