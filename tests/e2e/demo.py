"""`make demo`: the whole chain on this machine, from a corrupting "GPU" to a replaced node.

A real DDP training job (3 simulated nodes x 2 ranks, gloo on the CPU) runs with a persistent
fault on one rank; the agent names it and publishes to an embedded CloudWatch; the local alarm
evaluator (stand-in for CloudWatch alarm evaluation + EventBridge) starts the real workflow
definition from `cdk synth`, whose real Lambda handlers localize, admit, cordon (Kubernetes API
stand-in) and health-check (HyperPod simulator) the node; the demo then approves with the real
operator CLI, as an on-call role, through the approve function's URL (a loopback stand-in that
checks the SigV4 signature and hands the real approve function the authenticated ARN), and the
node is replaced. Before the approval the workflow's Screen step runs the node screen on the
cordoned node: its Kubernetes Job's pod is here a local process, the real `python -m
sdc_agent.screen` on simulated CPU "GPUs", the demo's faulty GPU with an injected GEMM fault, and
its verdict is a line of the approval message. Then the job starts again on the cluster's nodes
as they are now, without the fault: it resumes from the checkpoint `sdc.clean_resume_step`
chooses by the alarm the guard recorded next to its checkpoints (the one the pipeline announced;
the newer checkpoint inside the suspect window is refused), the guard verifies the loaded weights
and training goes on.
Every stand-in is described in tests/e2e/harness.
No AWS account, no Kubernetes, no GPU needed.

    python -m tests.e2e.demo [--reject] [--no-fault] [--dry-run] [--deployed] [--canary]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdc_agent.drills.launch import launch

if TYPE_CHECKING:
    from tests.e2e.harness.pipeline import LocalPipeline
    from tests.e2e.harness.runtime import Invocation

FAULTY_RANK = 3
FAULT_STEP = 7
ONCALL_ROLE = "sdc-oncall"
ONCALL_SESSION = "demo-operator"
SCREEN_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/llama-train:demo"
"""The demo's ``screenImage``: named in the Job, never pulled (the pod is a local process)."""
SCREEN_FAULT = "gemm-x1000"
"""The fault the screen injects into the faulty GPU's simulated device (``--fault``): the
training fault's x1000, on the screen's own GEMMs."""
SCREEN_REPETITIONS = 2
"""Repetitions of the screen's suite (``--repetitions``): a persistent fault shows in the first;
the shipped default, 16, is for intermittent ones."""


class Timeline:
    """Prints one line per stage with the time since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.time()  # wall clock: the Lambda adapter stamps invocations with it
        self.failures: list[str] = []

    def at(self, when: float | None = None) -> str:
        return f"[{(when if when is not None else time.time()) - self.t0:6.1f}s]"

    def say(self, text: str, when: float | None = None) -> None:
        print(f"{self.at(when)} {text}", flush=True)

    def fail(self, text: str) -> None:
        self.failures.append(text)
        self.say(f"FAILED: {text}")


def _train(
    pipeline: LocalPipeline, fault: bool, spool: str, run_dir: str | None = None
) -> dict[str, Any]:
    """The training job: 6 processes, the agent publishing to the embedded CloudWatch; with
    ``run_dir``, its checkpoints and the guard's alarm log are kept there (shared storage)."""
    cluster = pipeline.cluster
    faults = (
        [
            {
                "kind": "ScaleOutputElement",
                "layer": "net.4",
                "factor": 1000.0,
                "rank": FAULTY_RANK,
                "step": FAULT_STEP,
            }
        ]
        if fault
        else []
    )
    job = {
        "steps": 30,
        "schedule": {"audit_every": 5, "check_every": 5, "ckpt_every": 5, "peer_offset": 2},
        "faults": faults,
        "publisher": {
            "cluster_name": cluster.hyperpod_name,
            "job_name": cluster.job,
            "spool_dir": spool,
        },
        "run_dir": run_dir,
    }
    # Forked from one server that imported torch once: the restart's launch then costs little.
    (results,) = launch(
        [("sdc_agent.drills.job:train_drill", job)],
        world=6,
        ranks_per_node=2,
        start_method="forkserver",
    )
    errors = [r for r in results if "error" in r]
    if errors:
        raise RuntimeError(errors[0]["trace"])
    return {**results[0], "updates_by_rank": {r["rank"]: r["updates"] for r in results}}


def _applied(tl: Timeline, step: int, result: dict[str, Any]) -> str:
    """What each rank's own record (the optimizer steps it ran) says of the alarmed ``step``:
    stated as verified, or a failure of the demo when some rank applied it."""
    updates = result["updates_by_rank"]
    applied = sorted(rank for rank, steps in updates.items() if step in steps)
    if applied:
        tl.fail(f"ranks {applied} applied step {step}, which alarmed")
        return f"step {step} was APPLIED by ranks {applied}"
    last = max((max(steps) for steps in updates.values() if steps), default=None)
    return (
        f"step {step} was not applied: no rank's optimizer stepped for it (the {len(updates)} "
        f"ranks' last update: step {last})"
    )


def _job_node(job: dict[str, Any]) -> str:
    """The node a screen Job is pinned to (its required node affinity on the node's name)."""
    pod = job["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return str(terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])


class LocalScreen:
    """The screen Job's pod, as a local process: given to the Kubernetes stand-in as its
    ``screen_result``, it runs the Job's own command and arguments (``python -m
    sdc_agent.screen``, here with this interpreter), its termination log in ``log_dir``, on as
    many simulated devices as the Job asked GPUs for, with ``--fault`` on ``faulty_gpu`` when the
    Job's node is ``faulty_node``. Records every run (``runs``)."""

    def __init__(self, log_dir: str, faulty_node: str, faulty_gpu: int) -> None:
        self.log_dir = Path(log_dir)
        self.faulty_node = faulty_node
        self.faulty_gpu = faulty_gpu
        self.runs: list[dict[str, Any]] = []

    def __call__(self, job: dict[str, Any]) -> tuple[str | None, int]:
        name = job["metadata"]["name"]
        node = _job_node(job)
        container = job["spec"]["template"]["spec"]["containers"][0]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        log = self.log_dir / f"{name}-termination-log"
        args = list(container["args"])
        args[args.index("--termination-log") + 1] = str(log)
        args += ["--simulate", str(gpus), "--repetitions", str(SCREEN_REPETITIONS)]
        if node == self.faulty_node:
            args += ["--fault", f"{self.faulty_gpu}:{SCREEN_FAULT}"]
        command = [*container["command"], *args]
        started = time.time()
        try:
            done = subprocess.run(
                [sys.executable, *command[1:]],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 137  # as a pod killed at its deadline
        message = log.read_text() if log.exists() else None
        self.runs.append(
            {
                "job": name,
                "node": node,
                "gpus": gpus,
                "command": shlex.join(command),
                "exit_code": code,
                "seconds": time.time() - started,
            }
        )
        return message, code


def _wall(call: Invocation) -> str:
    return f"({call.ended - call.started:.2f} s)"


def _approve_line(event: dict[str, Any], response: dict[str, Any]) -> str:
    """The approve function's call, as its URL authenticated it (signed, and by whom)."""
    caller = event["requestContext"]["authorizer"]["iam"]["userArn"]
    scope = event["headers"]["authorization"].split("Credential=")[1].split(",")[0]
    body = json.loads(response.get("body") or "{}")
    outcome = (
        f"{body.get('decision')} recorded, approver {body.get('approver')}"
        if response.get("statusCode") == 200
        else f"refused {body.get('error')}"
    )
    return (
        f"approve (function URL, SigV4 {'/'.join(scope.split('/')[2:4])}, authenticated as "
        f"{caller}): {outcome} (HTTP {response.get('statusCode')})"
    )


def _screen_lines(r: dict[str, Any], screen: LocalScreen | None) -> list[str]:
    """The Screen step's call: the Job it created (and its pod's run, from ``screen``), or the
    verdict it read from the pod's termination message; none for a poll still waiting."""
    status = r.get("status")
    if status == "in_progress":
        if r.get("started_at") is None:
            return []
        runs = [s for s in (screen.runs if screen else []) if s["job"] == r.get("job")]
        ran = [
            f"  the Job's pod, here a local process on {s['node']}: $ {s['command']} -> exit "
            f"{s['exit_code']} ({s['seconds']:.1f} s)"
            for s in runs
        ]
        return [
            f"screen: Job {r.get('namespace')}/{r.get('job')} created on the cordoned node "
            f"({r.get('gpus')} GPUs, deadline {r.get('deadline_seconds')} s)",
            *ran,
        ]
    if status == "reproduced":
        verdict = f"reproduced on GPU {r.get('gpu_index')} (UUID {r.get('gpu_uuid')})"
    else:
        verdict = f"{status} ({r.get('reason')})"
    deleted = ", Job deleted" if r.get("deleted") else ""
    return [f"screen: {verdict}{deleted}"]


def _report_workflow(
    tl: Timeline, calls: list[Invocation], screen: LocalScreen | None = None
) -> None:
    """One line per Lambda the workflow invoked, from the adapter's record, in start order."""
    for call in sorted(calls, key=lambda c: c.started):
        r = call.result or {}
        if call.error:
            line = f"{call.folder}: error {call.error}"
        elif call.folder == "localize":
            s = (r.get("suspects") or [{}])[0]
            ranks = (
                sorted(int(k) for k in s.get("ranks") or {})
                if isinstance(s.get("ranks"), dict)
                else s.get("ranks")
            )
            line = (
                f"localize: {len(r.get('suspects', []))} suspect(s): {s.get('node_name')} -> instance "
                f"{s.get('instance_id')} (group {s.get('instance_group')}), ranks {ranks}, "
                f"check {s.get('check')}, verdict {s.get('verdict')}, step {s.get('step')}, "
                f"window {s.get('suspect_window')}"
            )
        elif call.folder == "admit":
            line = f"admit: {r.get('decision')} ({r.get('remediation_id') or r.get('reason')})"
        elif call.folder in ("cordon", "uncordon"):
            verb = "cordoned" if call.folder == "cordon" else "uncordoned"
            dry = " [dry run: nothing sent]" if r.get("dry_run") else ""
            line = f"{call.folder}: {r.get('node_name')} {verb if r.get('changed') or r.get('dry_run') else 'unchanged'}{dry}"
        elif call.folder == "start_health_check":
            line = f"deep health check started: {', '.join(r.get('checks', []))}"
        elif call.folder == "poll_health_check":
            if r.get("status") == "in_progress":
                continue
            line = f"deep health check: {r.get('status')} ({r.get('detail')})"
        elif call.folder == "screen":
            lines = _screen_lines(r, screen)
            if not lines:
                continue
            line = "\n".join([lines[0], *(f"{' ' * 11}{extra}" for extra in lines[1:])])
        elif call.folder == "request_approval":
            line = "approval requested (task token stored, evidence sent to SNS)"
        elif call.folder == "approve":
            line = _approve_line(call.payload, r)
        elif call.folder == "replace":
            line = f"replace: mode {r.get('mode')}, requested={r.get('requested')} {r.get('detail') or ''}".rstrip()
        elif call.folder == "record":
            line = f"ledger: {call.payload.get('transition')}" + (
                " + notification" if call.payload.get("notify") else ""
            )
        else:
            line = f"{call.folder}: {json.dumps(r)[:120]}"
        head, *rest = line.split("\n")
        tl.say("\n".join([f"  {head} {_wall(call)}", *rest]), call.started)


def run(argv: list[str] | None = None) -> int:
    """The demo; returns the process exit status (0 when every stage did what it should)."""
    parser = argparse.ArgumentParser(prog="make demo ARGS=...", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--reject", action="store_true", help="the operator rejects and releases the node"
    )
    parser.add_argument(
        "--no-fault", action="store_true", help="a clean run: expect no alarm at all"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="deploy with dryRun: log cordon/replace only"
    )
    parser.add_argument(
        "--deployed",
        action="store_true",
        help="first `cdk deploy` the stack (pinned CDK CLI, embedded AWS), then run the chain "
        "on what CloudFormation created instead of the synthesized template",
    )
    parser.add_argument(
        "--canary",
        action="store_true",
        help="one live canary instead of a training job: schedule -> alarm -> rule -> "
        "workflow in dry run on the reserved canary node, closing itself",
    )
    args = parser.parse_args(argv)
    # Imported here, not at the top: under `make demo` this module is the program's __main__,
    # which every training process imports again, and the harness brings aws_cdk and its
    # Node.js runtime along: seconds of CPU per process, twice six processes.
    from tests.e2e.harness.deployed import deployed
    from tests.e2e.harness.pipeline import LocalPipeline
    from tests.e2e.harness.runtime import process_environment
    from tests.e2e.scenario import local_cluster, pending_for

    tl = Timeline()
    if args.canary:
        from tests.e2e.demo_canary import run_canary

        print("sdc-guard demo: one live canary through the stand-ins\n", flush=True)
        run_canary(tl)
        return _verdict(tl)
    cluster = local_cluster(3)
    print(
        "sdc-guard demo: a silent-data-corruption drill, end to end, on embedded stand-ins\n",
        flush=True,
    )
    # The Screen step runs only with a screenImage: the demo's, whose Job's pod is LocalScreen.
    context: dict[str, Any] = {"screenImage": SCREEN_IMAGE}
    if args.dry_run:
        context["dryRun"] = True
    with (
        # The training processes name their pods <job>-worker-<rank> from SDC_JOB_NAME. Set
        # before the pipeline's threads start, put back after they stopped: os.environ is
        # shared by every thread, and writing it while one reads it breaks that one.
        process_environment({"SDC_JOB_NAME": cluster.job}),
        tempfile.TemporaryDirectory(prefix="sdc-demo-") as spool,
        tempfile.TemporaryDirectory(prefix="sdc-demo-run-") as run_dir,
        tempfile.TemporaryDirectory(prefix="sdc-demo-screen-") as screen_dir,
        (
            deployed(cluster, context, quiet_handlers=True)
            if args.deployed
            else LocalPipeline(cluster, context, quiet_handlers=True)
        ) as p,
    ):
        tl.say(
            f"stand-ins up: moto at {p.endpoint} (CloudWatch, Logs, DynamoDB, SNS, Step Functions, "
            f"SageMaker, EKS), Kubernetes API at {p.kube.url}, HyperPod cluster '{cluster.hyperpod_name}' "
            f"with {len(cluster.instance_ids)} nodes; state machine "
            f"{'deployed by `cdk deploy`' if args.deployed else 'from `cdk synth`'}; approve "
            f"function URL (AWS_IAM) at {p.approval_url}"
            + (f", standing in for ApprovalUrl {p.deployed_approval_url}" if args.deployed else "")
        )
        victim = cluster.instance_ids[FAULTY_RANK // cluster.ranks_per_node]
        victim_node = cluster.node_name(victim)
        # The faulty GPU's index on its node: the training fault's rank's local rank.
        faulty_gpu = FAULTY_RANK % cluster.ranks_per_node
        screen = LocalScreen(screen_dir, victim_node, faulty_gpu)
        p.kube.screen_result = screen
        what = (
            "no fault"
            if args.no_fault
            else (
                f"x1000 on one forward output element of rank {FAULTY_RANK} ({victim_node}) from step {FAULT_STEP}"
            )
        )
        tl.say(
            f"training: 3 nodes x 2 ranks (gloo, CPU), audits every 5 steps, weight checks every 5; {what}"
        )
        started = time.monotonic()
        result = _train(p, not args.no_fault, spool, run_dir)
        alarm = result["alarm"]
        if alarm is None:
            tl.say(
                f"training finished: {len(result['updates'])} steps, every check passed, no alarm "
                f"({time.monotonic() - started:.1f} s)"
            )
            fired = p.evaluator.evaluate()
            tl.say(f"CloudWatch alarms: {'none fired' if not fired else f'{len(fired)} fired'}")
            if not args.no_fault or fired:
                tl.fail(
                    "expected an alarm" if not args.no_fault else "an alarm fired on a clean run"
                )
            return _verdict(tl)
        names = ", ".join(
            f"rank {r} -> {i['node_name']} -> {i['instance_id']} ({i['gpu_uuid']})"
            for r, i in alarm["ranks"].items()
        )
        tl.say(
            f"agent ALARM at step {alarm['step']}: check '{alarm['check']}' ({alarm['metric']['name']}="
            f"{alarm['metric']['value']}), pairs {alarm['mismatched_pairs']}, culprits {alarm['culprits']}; "
            f"{names}; window {alarm['suspect_window']}; {_applied(tl, alarm['step'], result)} "
            f"({time.monotonic() - started:.1f} s of training)"
        )
        tl.say(f"  report + metrics published to CloudWatch (delivered={result['delivered']})")
        fired = p.evaluator.evaluate()
        if len(fired) != 1:
            tl.fail(f"expected one CloudWatch alarm to fire, got {len(fired)}")
            return _verdict(tl)
        execution = p.executions[-1]
        tl.say(
            f"CloudWatch alarm {fired[0]['detail']['alarmName']} -> ALARM; EventBridge rule -> "
            f"workflow execution {execution.rsplit(':', 1)[-1]}"
        )
        approval = pending_for(p, execution)
        # The approval record is stored before the request_approval function returns: wait for
        # its invocation to end, so the timeline shows it before the operator's decision.
        p.wait(
            lambda: any(c.folder == "request_approval" for c in p.invocations),
            what="the request_approval invocation to return",
        )
        reported = len(p.invocations)  # nothing runs while the workflow waits for the decision
        _report_workflow(tl, p.invocations[:reported], screen)
        _report_approval_message(tl, p, approval, args, victim_node, faulty_gpu, screen)
        decision = (
            ["reject", approval, "--release", "--reason", "demo: false alarm"]
            if args.reject
            else ["approve", approval, "--reason", "demo: replay mismatch confirmed"]
        )
        cli = Path(sys.executable).with_name("sdc-remediation")
        shown = shlex.join(["sdc-remediation", *decision])
        cli_started = time.time()
        oncall = p.operator_environment(ONCALL_ROLE, ONCALL_SESSION)
        out = subprocess.run(
            [str(cli), *decision],
            env={**p.cli_env(), **oncall, "PATH": str(cli.parent)},
            capture_output=True,
            text=True,
            timeout=180,
        )
        tl.say(f"operator: $ {shown}\n{' ' * 10}{(out.stdout or out.stderr).strip()}", cli_started)
        if out.returncode != 0:
            tl.fail(f"the CLI exited {out.returncode}")
            return _verdict(tl)
        _check_authenticated_decision(tl, p)
        done = p.finish(execution)
        _report_workflow(tl, p.invocations[reported:], screen)
        tl.say(
            f"workflow {done['status']}; ledger for {victim}: {' -> '.join(p.transitions(victim))}"
        )
        for n in p.notifications():
            tl.say(f"  SNS: {n['subject']}")
        _check_outcome(tl, p, args, victim, victim_node, done["status"])
        announced = _report_resume(tl, p, alarm, result["saves"], run_dir)
        if announced is not None:
            _restart_job(tl, p, alarm, announced, run_dir)
        return _verdict(tl)


def _report_approval_message(
    tl: Timeline,
    p: LocalPipeline,
    approval: str,
    args: argparse.Namespace,
    victim_node: str,
    faulty_gpu: int,
    screen: LocalScreen,
) -> None:
    """The approval request as SNS delivered it, then what its screen line rests on: exactly
    one screen Job, on the suspect node, naming the faulty GPU (a dry run creates none)."""
    messages = [n for n in p.notifications() if f" approve {approval} " in (n["message"] or "")]
    if not messages:
        tl.fail(f"no approval message names {approval}")
        return
    body = messages[-1]["message"]
    indent = " " * 11
    tl.say(
        f"approval message (SNS): {messages[-1]['subject']}\n"
        + "\n".join(f"{indent}| {line}".rstrip() for line in body.splitlines())
    )
    created = p.kube.created_jobs
    nodes = [_job_node(j) for j in created]
    if args.dry_run:
        if created or "screen: skipped" not in body:
            tl.fail("a dry run should create no screen Job and say the screen was skipped")
        else:
            tl.say("dry run: the Screen step created no Job; the approval message says so")
        return
    expected = f"screen: reproduced on GPU {faulty_gpu} (UUID cpu-{faulty_gpu})"
    if nodes != [victim_node] or len(screen.runs) != 1:
        tl.fail(f"expected one screen Job, on {victim_node}; created on {nodes}")
    elif expected not in body:
        tl.fail(f"the approval message should say '{expected}'")
    elif p.kube.jobs:
        tl.fail("the screen Job was not deleted once its result was read")
    else:
        took = screen.runs[0]["seconds"]
        tl.say(
            f"screen Jobs: 1, on {victim_node} (the suspect), deleted after its result; it took "
            f"{took:.1f} s. The screen runs seeded known-answer ops (GEMMs, attention, norms, "
            "reductions) on every GPU of the cordoned node and compares them bit for bit across "
            f"the GPUs: it named GPU {faulty_gpu}, the GPU of rank {FAULTY_RANK} (here a simulated "
            "device with an injected fault, standing in for the training fault's GPU). A clean "
            "screen would not exonerate the node (a fault may not fire in a few repetitions, or "
            "only in the job's own ops): the operator still decides on the job's evidence"
        )


def _check_authenticated_decision(tl: Timeline, p: LocalPipeline) -> None:
    """The decision went through the approve function's URL, as the on-call role's session."""
    if not p.function_url.events:
        tl.fail("the decision did not go through the approve function's URL")
        return
    caller = p.function_url.events[-1]["requestContext"]["authorizer"]["iam"]["userArn"]
    expected = f"assumed-role/{ONCALL_ROLE}/{ONCALL_SESSION}"
    if not caller.endswith(expected):
        tl.fail(f"the approver should be the on-call role's session ({expected}), got {caller}")


def _check_outcome(
    tl: Timeline,
    p: LocalPipeline,
    args: argparse.Namespace,
    victim: str,
    victim_node: str,
    status: str,
) -> None:
    if status != "SUCCEEDED":
        tl.fail(f"workflow ended {status}")
    node = p.kube.nodes.get(victim_node)
    if args.dry_run:
        if p.kube.patches or p.hyperpod.calls:
            tl.fail("dry run wrote to the cluster")
        else:
            tl.say("dry run: no Kubernetes PATCH, no HyperPod call was made")
    elif args.reject:
        if node is None or node["spec"].get("unschedulable"):
            tl.fail("the node should be schedulable again after reject --release")
        else:
            tl.say(f"{victim_node} is schedulable again (released by the operator)")
    elif victim not in p.hyperpod.replaced:
        tl.fail("the node was not replaced")
    else:
        tl.say(
            f"{victim_node} replaced by HyperPod: new instance {p.hyperpod.replaced[victim]} joined "
            f"group {p.cluster.instance_group}"
        )


def _announced_resume(p: LocalPipeline) -> tuple[str, dict[str, Any]] | None:
    """The resume rule of the last transition notification that states one (its subject)."""
    for n in reversed(p.notifications()):
        try:
            body = json.loads(n["message"] or "")
        except ValueError:
            continue  # the approval request: prose, stated in its own words
        if isinstance(body, dict) and body.get("resume"):
            return n["subject"], body["resume"]
    return None


def _report_resume(
    tl: Timeline, p: LocalPipeline, alarm: dict[str, Any], saves: list[list[Any]], run_dir: str
) -> dict[str, Any] | None:
    """What the restart has to go on: the guard's alarm record next to the job's checkpoints,
    and the rule the pipeline announced. Returns the announced rule (``max_step``,
    ``sentence``), None when no notification stated one."""
    records = sorted(path.name for path in Path(run_dir).glob("alarm-*.json"))
    checkpoints = sorted(step for step, _tags in saves)
    tl.say(
        f"run directory (shared storage): checkpoints at steps {checkpoints}, saved with the "
        f"guard's tags; alarm log {records} (Guard(alarm_dir=...), written before the stop)"
    )
    if len(records) != 1:
        tl.fail(f"the guard should have recorded its one alarm, the log holds {records}")
    announced = _announced_resume(p)
    if announced is None:
        tl.fail("no notification stated where the job may resume")
        return None
    subject, resume = announced
    tl.say(f"pipeline ({subject}): {resume['sentence']}")
    return resume


RESTART_STEPS = 6
"""Steps the restarted job trains: from the clean checkpoint past the alarm's step, so that the
audit that fired in the first run runs again (and passes) on the healthy rank set."""


def _restart_job(
    tl: Timeline, p: LocalPipeline, alarm: dict[str, Any], resume: dict[str, Any], run_dir: str
) -> None:
    """The job started again after the remediation, on the nodes the cluster has now (the
    replaced one under its new name) and without the fault: each rank asks
    ``sdc.clean_resume_step`` for the checkpoint to load, the guard checks that choice against
    the alarm log and verifies the loaded weights, and training goes on. The step it resumes
    from must be the newest checkpoint the pipeline's rule allows."""
    bound = resume["max_step"]  # None: no checkpoint is clean, restart from the initial weights
    cluster = p.cluster
    nodes = [
        cluster.node_name(p.hyperpod.replaced.get(i, i))
        for i in cluster.instance_ids[: 6 // cluster.ranks_per_node]
    ]
    tl.say(f"restart: the job starts again on {', '.join(nodes)} (2 ranks each), no fault")
    started = time.monotonic()
    job = {
        "steps": RESTART_STEPS,
        "schedule": {"audit_every": 5, "check_every": 5, "ckpt_every": 5, "peer_offset": 2},
        "run_dir": run_dir,
        "resume": True,
    }
    (results,) = launch(
        [("sdc_agent.drills.job:train_drill", job)],
        world=6,
        ranks_per_node=2,
        node_names=nodes,
        start_method="forkserver",
    )
    errors = [r for r in results if "error" in r]
    if errors:
        tl.fail(f"the restarted job failed: {errors[0]['error']}")
        return
    decisions = [r["resume"] for r in results]
    if any(d != decisions[0] for d in decisions):
        tl.fail("the ranks chose different checkpoints to resume from")
        return
    decision, result = decisions[0], results[0]
    chosen, checkpoints = decision["step"], decision["checkpoints"]
    refused = sorted(int(s) for s in decision["refused"])
    tags = decision["refused_tags"]
    why = "; ".join(
        f"checkpoint {s} was saved with last_weight_check_pass="
        f"{tags[str(s)]['last_weight_check_pass']}, weights_verified="
        f"{tags[str(s)]['weights_verified']}"
        for s in refused
    )
    tl.say(
        f"restart: checkpoints at steps {checkpoints}; sdc.clean_resume_step -> {chosen}"
        + (f" (resume with start_step={chosen + 1})" if chosen is not None else "")
        + (f"; refused {refused}: inside the alarm's suspect window ({why})" if refused else "")
    )
    expected = max((c for c in checkpoints if bound is not None and c <= bound), default=None)
    if chosen != expected:
        tl.fail(
            f"the job resumed from {chosen}, the pipeline's rule allows at most {bound} "
            f"(newest checkpoint there: {expected})"
        )
    lowest_suspect = -1 if bound is None else bound
    if not any(lowest_suspect < s <= alarm["step"] for s in refused):
        tl.fail(
            f"no checkpoint after step {bound} up to the alarm's step {alarm['step']} was refused: "
            "the demo no longer shows why the rule matters"
        )
    updates, start = result["updates"], decision["start_step"]
    trained = f"steps {updates[0]}-{updates[-1]}" if updates else "no step"
    tl.say(
        f"restart: loaded the checkpoint of step {chosen}; the guard found no recorded alarm "
        f"covering it and verified every replica's weights on start "
        f"(verified={decision['weights_verified_on_start']}), then trained {trained}: "
        + ("no alarm" if result["alarm"] is None else f"ALARM at step {result['alarm']['step']}")
        + f" (last audit pass {result['last_audit_pass']}, last weight check pass "
        f"{result['last_weight_check_pass']}, checkpoints saved {[s for s, _ in result['saves']]}) "
        f"({time.monotonic() - started:.1f} s)"
    )
    if result["alarm"] is not None:
        tl.fail("the restarted job raised an alarm on a healthy rank set")
    if not decision["weights_verified_on_start"]:
        tl.fail("the guard did not verify the loaded weights before the first step")
    if updates != list(range(start, start + RESTART_STEPS)):
        tl.fail(f"the restarted job should have applied steps {start}.., it applied {updates}")


def _verdict(tl: Timeline) -> int:
    if tl.failures:
        print(f"\ndemo FAILED: {'; '.join(tl.failures)}", flush=True)
        return 1
    print(f"\ndemo OK in {time.time() - tl.t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
