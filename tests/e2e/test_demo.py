"""`make demo` end to end: a real DDP job's alarm travels the whole chain to a replaced node."""

from __future__ import annotations

import pytest

from tests.e2e import demo

pytestmark = pytest.mark.slow


# The demo's own deadlines (training, the approval request, the workflow's end) add up to more
# than the suite's per-test timeout; on a busy machine they, not pytest, should say what hung.
@pytest.mark.timeout(900)
def test_the_demo_catches_the_faulty_rank_and_replaces_its_node(capsys):
    # Given the demo's training job with a persistent fault on rank 3 (node 1)
    # When it runs and the on-call operator approves through the real CLI and the approval URL
    status = demo.run([])
    out = capsys.readouterr().out
    # Then every stage happened, in order, the node behind rank 3 was replaced, and the timeline
    # ends with the restarted job: on the replacement node, without the fault, it resumes from
    # the checkpoint the pipeline announced, chosen by sdc.clean_resume_step from the alarm the
    # guard recorded next to the checkpoints, refusing the newer one inside the suspect window
    # (saved with a passing weight check), and trains on with no alarm; before the approval the
    # Screen step ran one Job on the cordoned suspect node, its pod the real screen (a local
    # process) with the fault on rank 3's GPU (local rank 1), and the approval message the
    # operator reads states the screen's verdict on that GPU
    assert status == 0, out
    stages = [
        "agent ALARM at step 10: check 'compute'",
        "rank 3 -> hyperpod-i-00000000000000001 -> i-00000000000000001",
        "CloudWatch alarm sdc-guard-sdc-local-sdc_replay_mismatch -> ALARM",
        "localize: 1 suspect(s): hyperpod-i-00000000000000001",
        "admit: admitted",
        "cordon: hyperpod-i-00000000000000001 cordoned",
        "deep health check: passed",
        "screen: Job sdc-screen/sdc-screen-",
        "the Job's pod, here a local process on hyperpod-i-00000000000000001: $ python -m "
        "sdc_agent.screen --termination-log ",
        "--simulate 8 --repetitions 2 --fault 1:gemm-x1000 -> exit 3",
        "screen: reproduced on GPU 1 (UUID cpu-1), Job deleted",
        "approval requested",
        "approval message (SNS): [sdc-guard] approve replacing hyperpod-i-00000000000000001?",
        "| screen: reproduced on GPU 1 (UUID cpu-1)",
        "screen Jobs: 1, on hyperpod-i-00000000000000001 (the suspect), deleted after its result",
        "A clean screen would not exonerate the node",
        "operator: $ sdc-remediation approve",
        "as arn:aws:sts::123456789012:assumed-role/sdc-oncall/demo-operator",
        "approve (function URL, SigV4 us-east-1/lambda, authenticated as "
        "arn:aws:sts::123456789012:assumed-role/sdc-oncall/demo-operator): approve recorded, "
        "approver arn:aws:sts::123456789012:assumed-role/sdc-oncall/demo-operator (HTTP 200)",
        "replace: mode api, requested=True",
        "workflow SUCCEEDED",
        "hyperpod-i-00000000000000001 replaced by HyperPod: new instance i-0000000000000a000",
        "run directory (shared storage): checkpoints at steps [4, 9], saved with the guard's "
        "tags; alarm log ['alarm-step0000000010-compute-rank0.json']",
        # the alarm's window is [5, 10]: the audit of step 5 passed, checkpoints are saved after
        # steps 4 and 9, so the job restarts from 4, never from 9
        "pipeline ([sdc-guard] replaced: hyperpod-i-00000000000000001): resume from the newest "
        "checkpoint at or before step 5",
        "restart: the job starts again on hyperpod-i-00000000000000000, "
        "hyperpod-i-0000000000000a000, hyperpod-i-00000000000000002 (2 ranks each), no fault",
        "restart: checkpoints at steps [4, 9]; sdc.clean_resume_step -> 4 (resume with "
        "start_step=5); refused [9]: inside the alarm's suspect window (checkpoint 9 was saved "
        "with last_weight_check_pass=9, weights_verified=True)",
        "restart: loaded the checkpoint of step 4; the guard found no recorded alarm covering it "
        "and verified every replica's weights on start (verified=True), then trained steps 5-10: "
        "no alarm (last audit pass 10, last weight check pass 9, checkpoints saved [9])",
        "demo OK",
    ]
    positions = [out.find(s) for s in stages]
    assert all(p >= 0 for p in positions), [
        s for s, p in zip(stages, positions, strict=True) if p < 0
    ]
    assert positions == sorted(positions)
    # and exactly one screen Job was created and run, its verdict inside the approval message
    assert out.count("screen: Job sdc-screen/") == 1
    assert out.count("the Job's pod, here a local process on ") == 1
    message = out[out.find("approval message (SNS):") : out.find("screen Jobs: 1")]
    assert "| screen: reproduced on GPU 1 (UUID cpu-1)" in message


@pytest.mark.timeout(600)
def test_the_canary_demo_closes_the_canary_through_the_approve_function(capsys):
    # Given the demo's canary mode (`python -m tests.e2e.demo --canary`)
    # When it runs one canary through the stand-ins
    status = demo.run(["--canary"])
    out = capsys.readouterr().out
    # Then its timeline shows the approval settled by the approve function (no person, nobody
    # paged), the workflow succeeding and the canary closing itself, in that order
    assert status == 0, out
    stages = [
        "schedule -> canary function: run c-",
        "approval requested; settled through the approve function's URL (nobody paged)",
        "approve (canary, through its URL, HTTP 200): approve recorded, approver sdc-guard canary",
        "ledger: approved (canary: no notification)",
        "workflow SUCCEEDED; ledger for the reserved node: cordoned -> health_check_passed -> "
        "awaiting_approval -> approved -> replaced",
        "canary: nobody paged",
        "canary closed itself",
        "demo OK",
    ]
    positions = [out.find(s) for s in stages]
    assert all(p >= 0 for p in positions), [
        s for s, p in zip(stages, positions, strict=True) if p < 0
    ]
    assert positions == sorted(positions)
