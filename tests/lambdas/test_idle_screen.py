"""The idle screener against moto and the loopback Kubernetes API with Jobs: idle HyperPod nodes
screened oldest first, a bounded number at a time, never beside a training pod (checked at
creation and before a result counts); a reproduced screen published as a finding of the
reserved idle-screen job; every outcome recorded, one node's error never stopping the others."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from remediation_factories import LEDGER, alarm_event
from test_screen_step import IMAGE, NAMESPACE, UUID, document

import sdc_contract as contract
from sdc_remediation import aws, clock
from sdc_remediation.clients.kube import KubeApi
from sdc_remediation.config import Settings
from sdc_remediation.dal import keys
from sdc_remediation.dal.screens import ScreenStore
from sdc_remediation.errors import ClusterApiUnavailable, ConfigurationError, InvalidStepInput
from sdc_remediation.logic import idle_screen
from sdc_remediation.logic.idle_screen import screen_report
from sdc_remediation.logic.localize.streams import ReportStreams, StreamFilter
from sdc_remediation.models import ScreenResult
from tests.e2e.harness.kube_jobs import JobsStandIn

CLUSTER = "hp-test"


@pytest.fixture
def k8s(monkeypatch: pytest.MonkeyPatch) -> Iterator[JobsStandIn]:
    """The loopback API with Jobs, the screen configured, at most 2 idle screens at once."""
    with JobsStandIn() as api:
        monkeypatch.setenv("K8S_API_ENDPOINT", api.url)
        monkeypatch.setenv("K8S_API_CA_DATA", api.ca_b64)
        monkeypatch.setenv("SCREEN_IMAGE", IMAGE)
        monkeypatch.setenv("SCREEN_NAMESPACE", NAMESPACE)
        monkeypatch.setenv("SCREEN_DEADLINE_SECONDS", "600")
        monkeypatch.setenv("SCREEN_IDLE_MAX_NODES", "2")
        yield api


def node(cloud: Any, index: int) -> str:
    return f"hyperpod-{cloud.nodes[index]}"


def idle_nodes(k8s: JobsStandIn, cloud: Any, count: int) -> list[str]:
    """``count`` schedulable HyperPod GPU nodes with nothing on them."""
    names = [node(cloud, i) for i in range(count)]
    for name in names:
        k8s.add_gpu_node(name, unschedulable=False)
    return names


def run(invoke: Any) -> dict[str, Any]:
    return invoke("screen_idle", {"action": "run"})


def screened_nodes(k8s: JobsStandIn) -> list[str]:
    """The node each created Job is pinned to, in order."""
    out = []
    for job in k8s.created_jobs:
        terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        out.append(terms[0]["matchFields"][0]["values"][0])
    return out


def store() -> ScreenStore:
    return ScreenStore(LEDGER, CLUSTER)


def screen_data() -> list[dict[str, Any]]:
    """What reached the idle screen's namespace (moto's PutMetricData store)."""
    namespace = contract.idle_screen_namespace("SDC")
    metrics = aws.client("cloudwatch").list_metrics(Namespace=namespace)["Metrics"]
    return [m for m in metrics if m["MetricName"] == contract.IDLE_SCREEN_METRIC]


def idle_reports() -> list[dict[str, Any]]:
    logs = aws.client("logs")
    streams = logs.describe_log_streams(logGroupName=f"/sdc/{CLUSTER}")["logStreams"]
    if not any(s["logStreamName"] == contract.IDLE_SCREEN_JOB for s in streams):
        return []
    events = logs.get_log_events(
        logGroupName=f"/sdc/{CLUSTER}", logStreamName=contract.IDLE_SCREEN_JOB
    )["events"]
    return [json.loads(e["message"]) for e in events]


def test_never_screened_first_then_oldest_at_most_the_bound(cloud, k8s, invoke):
    # Given four idle nodes: two screened long ago (one older), one never, one recently
    names = idle_nodes(k8s, cloud, 4)
    now = clock.now()
    for name, days in ((names[0], 40), (names[1], 90), (names[3], 2)):
        assert store().begin(name, f"old-{days}", now - timedelta(days=days))
        store().finish(name, f"old-{days}", "clean", now - timedelta(days=days))
    # When the screener runs with room for two screens
    out = run(invoke)
    # Then the never-screened node and the oldest screened one are screened, nothing else
    assert screened_nodes(k8s) == [names[2], names[1]]
    assert sorted(out["started"]) == sorted([names[2], names[1]])
    assert out["unscreened"] == 3
    # and a second run starts nothing more: two run already
    run(invoke)
    assert len(k8s.created_jobs) == 2


def test_a_node_with_a_training_pod_is_never_screened(cloud, k8s, invoke):
    # Given a training pod on one node, and a DaemonSet pod and a finished GPU pod on another
    busy, quiet = idle_nodes(k8s, cloud, 2)
    k8s.add_pod("trainer-0", busy, "default", gpus=8)
    k8s.add_pod(
        "dcgm-exporter",
        quiet,
        "kube-system",
        gpus=1,
        owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm"},
    )
    k8s.add_pod(
        "done", quiet, "default", gpus=8, phase="Succeeded", finished_at="2026-01-01T00:00:00Z"
    )
    # When the screener runs
    run(invoke)
    # Then only the node without a training pod is screened
    assert screened_nodes(k8s) == [quiet]


def test_a_cordoned_or_non_hyperpod_node_is_not_screened(cloud, k8s, invoke):
    k8s.add_gpu_node(node(cloud, 0), unschedulable=True)
    k8s.add_gpu_node("ip-10-0-0-1.ec2.internal", unschedulable=False)
    run(invoke)
    assert k8s.created_jobs == []


def test_a_training_pod_arriving_aborts_the_screen_and_raises_nothing(cloud, k8s, invoke):
    # Given a screen running on an idle node
    (name,) = idle_nodes(k8s, cloud, 1)
    run(invoke)
    (job,) = [j["metadata"]["name"] for j in k8s.created_jobs]
    k8s.run_job(job, json.dumps(document("reproduced")))
    # When a training pod lands on the node before the result is read
    k8s.add_pod("trainer-0", name, "default", gpus=8)
    out = run(invoke)
    # Then the Job is deleted, the screen aborted, no finding published
    assert out["outcomes"] == {name: "aborted"}
    assert (NAMESPACE, job) in [(ns, n) for ns, n, _ in k8s.deleted]
    assert store().get(name).last_outcome == "aborted"
    assert screen_data() == [] and idle_reports() == []


def test_a_reproduced_screen_publishes_the_reserved_jobs_finding(cloud, k8s, invoke):
    (name,) = idle_nodes(k8s, cloud, 1)
    run(invoke)
    (job,) = [j["metadata"]["name"] for j in k8s.created_jobs]
    k8s.run_job(job, json.dumps(document("reproduced")))
    out = run(invoke)
    assert out["outcomes"] == {name: "reproduced"}
    (report,) = idle_reports()
    assert report["job"] == contract.IDLE_SCREEN_JOB and report["check"] == "compute"
    assert report["culprits"] == [0]
    assert report["ranks"]["0"] == {
        "node_name": name,
        "instance_id": cloud.nodes[0],
        "gpu_uuid": UUID,
        "local_rank": 3,
    }
    dims = [{d["Name"]: d["Value"] for d in m["Dimensions"]} for m in screen_data()]
    assert {"ClusterName": CLUSTER, "JobName": contract.IDLE_SCREEN_JOB, "NodeName": name} in dims


def test_a_clean_screen_is_recorded_and_rescreened_only_after_the_age(
    cloud, k8s, invoke, monkeypatch
):
    (name,) = idle_nodes(k8s, cloud, 1)
    run(invoke)
    (job,) = [j["metadata"]["name"] for j in k8s.created_jobs]
    k8s.run_job(job, json.dumps(document("clean")))
    assert run(invoke)["outcomes"] == {name: "clean"}
    assert screen_data() == []
    assert len(k8s.created_jobs) == 1
    # 29 days on: not due; 31 days on: due again
    real = clock.now
    monkeypatch.setattr(clock, "now", lambda: real() + timedelta(days=29))
    run(invoke)
    assert len(k8s.created_jobs) == 1
    monkeypatch.setattr(clock, "now", lambda: real() + timedelta(days=31))
    run(invoke)
    assert len(k8s.created_jobs) == 2


def test_a_failed_job_is_recorded_and_others_go_on(cloud, k8s, invoke):
    a, b = idle_nodes(k8s, cloud, 2)
    run(invoke)
    jobs = {
        screened: j["metadata"]["name"]
        for screened, j in zip(screened_nodes(k8s), k8s.created_jobs, strict=True)
    }
    k8s.run_job(jobs[a], None, exit_code=1)
    k8s.run_job(jobs[b], json.dumps(document("clean")))
    out = run(invoke)
    assert out["outcomes"] == {a: "failed", b: "clean"}
    assert "no termination message" in store().get(a).last_reason


def test_two_runs_at_once_do_not_start_two_screens_on_a_node(cloud, k8s):
    # Given a run that claimed the node in the ledger first
    (name,) = idle_nodes(k8s, cloud, 1)
    assert store().begin(name, "sdc-screen-other-run", clock.now())
    # When another run tries to start a screen on it
    screener = idle_screen.IdleScreener(Settings(), lambda: _api())
    started = screener.start(k8s.nodes[name])
    # Then it creates no Job
    assert started is None and k8s.created_jobs == []


def _api() -> KubeApi:
    return KubeApi.from_settings(Settings())


def test_a_malformed_event_is_a_clear_error(cloud, k8s, invoke):
    with pytest.raises(InvalidStepInput, match='"action": "run"'):
        invoke("screen_idle", {"action": "scan"})
    with pytest.raises(InvalidStepInput, match='needs "node"'):
        invoke("screen_idle", {"action": "screen"})


def test_the_screen_action_screens_one_node_and_refuses_with_why(cloud, k8s, invoke):
    free, busy, cordoned = [*idle_nodes(k8s, cloud, 2), node(cloud, 2)]
    k8s.add_gpu_node(cordoned, unschedulable=True)
    k8s.add_pod("trainer-0", busy, "default", gpus=8)
    out = invoke("screen_idle", {"action": "screen", "node": free})
    assert out["node"] == free and screened_nodes(k8s) == [free]
    with pytest.raises(idle_screen.ScreenRefused, match="already has a running screen"):
        invoke("screen_idle", {"action": "screen", "node": free})
    with pytest.raises(idle_screen.ScreenRefused, match="training pod"):
        invoke("screen_idle", {"action": "screen", "node": busy})
    with pytest.raises(idle_screen.ScreenRefused, match="cordoned"):
        invoke("screen_idle", {"action": "screen", "node": cordoned})


def test_settings_are_bounded(monkeypatch):
    monkeypatch.setenv("SCREEN_RESCREEN_DAYS", "400")
    with pytest.raises(ConfigurationError, match="SCREEN_RESCREEN_DAYS"):
        _ = Settings().screen_rescreen_days
    monkeypatch.setenv("SCREEN_IDLE_MAX_NODES", "0")
    with pytest.raises(ConfigurationError, match="SCREEN_IDLE_MAX_NODES"):
        _ = Settings().screen_idle_max_nodes


def test_the_ledger_key_is_the_contracts():
    assert keys.screen(CLUSTER, "hyperpod-i-1")["pk"] == contract.screens_key(CLUSTER)


# -- the finding enters the workflow: localize --------------------------------------------------


def idle_alarm_event(at: datetime) -> dict[str, Any]:
    """The idle screen's alarm (its own namespace, its reserved job only) entering ALARM."""
    event = alarm_event(
        time=at,
        metric=contract.IDLE_SCREEN_METRIC,
        alarm_name="sdc-" + contract.IDLE_SCREEN_ALARM_SUFFIX,
        job=contract.IDLE_SCREEN_JOB,
    )
    event["detail"]["configuration"]["metrics"][0]["expression"] = contract.job_alarm_query(
        contract.idle_screen_namespace("SDC"),
        contract.IDLE_SCREEN_METRIC,
        CLUSTER,
        only_job=contract.IDLE_SCREEN_JOB,
    )
    return event


def reproduce(k8s: JobsStandIn, invoke: Any, name: str) -> None:
    """Screen ``name`` and let the screen reproduce a fault on GPU 3."""
    before = len(k8s.created_jobs)
    invoke("screen_idle", {"action": "screen", "node": name})
    job = k8s.created_jobs[before]["metadata"]["name"]
    k8s.run_job(job, json.dumps(document("reproduced")))
    assert run(invoke)["outcomes"] == {name: "reproduced"}


def test_localize_accepts_the_idle_report_from_its_own_stream(cloud, k8s, invoke):
    # Given a reproduced idle screen on a node no job runs on
    (name,) = idle_nodes(k8s, cloud, 1)
    reproduce(k8s, invoke, name)
    # When its alarm reaches localize
    out = invoke("localize", idle_alarm_event(datetime.now(UTC)))
    # Then the node is the suspect, as the reserved job's, with the GPU the screen named
    (suspect,) = out["suspects"]
    assert suspect["node_name"] == name and suspect["job"] == contract.IDLE_SCREEN_JOB
    assert suspect["ranks"]["0"]["gpu_uuid"] == UUID
    assert out["refused"] == []


def test_localize_refuses_an_idle_report_the_ledger_does_not_hold(cloud, k8s, invoke):
    # Given a real reproduced screen on one node, and a forged idle report naming another
    real, other = idle_nodes(k8s, cloud, 2)
    reproduce(k8s, invoke, real)
    forged = screen_report(CLUSTER, other, cloud.nodes[1], idle_screen_result(), datetime.now(UTC))
    aws.client("logs").put_log_events(
        logGroupName=f"/sdc/{CLUSTER}",
        logStreamName=contract.IDLE_SCREEN_JOB,
        logEvents=[{"timestamp": int(time.time() * 1000), "message": json.dumps(forged)}],
    )
    # When the idle alarm reaches localize
    out = invoke("localize", idle_alarm_event(datetime.now(UTC)))
    # Then only the screened node is a suspect; the forged claim is refused
    assert [s["node_name"] for s in out["suspects"]] == [real]
    assert any("no reproduced screen" in r["reason"] for r in out["refused"])


def test_per_pod_streams_take_the_idle_report_from_its_own_stream_only():
    streams = ReportStreams(mode=contract.REPORT_STREAM_POD, namespace="default")
    job = contract.IDLE_SCREEN_JOB
    assert streams.accepts(job, job)
    assert not streams.accepts(f"default/{job}/trainer-0", job)
    assert not streams.accepts(contract.CANARY_JOB, job)
    assert streams.filters([job]) == [StreamFilter(names=(job,))]


def idle_screen_result() -> ScreenResult:
    return ScreenResult(status="reproduced", gpu_index=0, gpu_uuid=UUID)


def test_the_run_puts_its_metrics(cloud, k8s, invoke, capsys):
    idle_nodes(k8s, cloud, 3)
    capsys.readouterr()
    run(invoke)
    emitted = capsys.readouterr().out
    blobs = [json.loads(line) for line in emitted.splitlines() if '"_aws"' in line]
    (blob,) = [b for b in blobs if contract.NODES_UNSCREENED_METRIC in b]
    # Powertools lists the values of a metric added more than once
    assert blob[contract.NODES_UNSCREENED_METRIC] in (3, 3.0, [3.0])
    assert sum(blob[contract.SCREEN_STARTED_METRIC]) == 2
    assert blob["ClusterName"] == CLUSTER


def test_a_kubernetes_error_on_one_node_is_counted_and_the_run_goes_on(
    cloud, k8s, invoke, monkeypatch
):
    # Given two idle nodes, and an API that refuses the Job of the first one (fault injected)
    a, b = idle_nodes(k8s, cloud, 2)
    create = KubeApi.create_job

    def flaky(self: KubeApi, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
        if job["metadata"]["labels"]["sdc.guard/node"] == a:
            raise ClusterApiUnavailable("create job: Kubernetes answered 503")
        return create(self, namespace, job)

    monkeypatch.setattr(KubeApi, "create_job", flaky)
    # When the screener runs
    out = run(invoke)
    # Then the other node is screened, the error is in the answer, and the ledger frees the node
    assert out["started"] == [b]
    assert "503" in out["errors"][a]
    entry = store().get(a)
    assert entry.running_job is None and entry.last_outcome == "failed"


def test_without_an_image_there_is_no_idle_screening(cloud, k8s, invoke, monkeypatch):
    idle_nodes(k8s, cloud, 1)
    monkeypatch.delenv("SCREEN_IMAGE")
    with pytest.raises(ConfigurationError, match="SCREEN_IMAGE"):
        run(invoke)
    assert k8s.created_jobs == []
