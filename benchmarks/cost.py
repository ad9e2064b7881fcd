"""What sdc-guard costs to run on AWS: measured call counts times list prices, per month.

    python benchmarks/cost.py [--json [PATH]] [--nodes 64,512,2048] [--nodes-per-job 64]
                              [--gpus-per-node 8] [--health-check-minutes 120]
                              [--lambda-seconds 1] [--ledger-months 12]
                              [--liveness-interval S] [--cluster-nodes 6] [--skip-pipeline]
    python benchmarks/cost.py --load PATH [...]   # price a saved --json measurement again

Two measurements, then arithmetic:

1. The agent's publisher (``sdc_agent.publish.CloudWatchPublisher``, as DP rank 0 of a job runs
   it) against an in-process moto: one rank map, a liveness batch, one alarm naming one node.
   Every AWS call is counted by a botocore ``before-call`` hook on its clients: PutMetricData
   calls, datapoints and the distinct series (namespace, metric, dimensions), PutLogEvents calls
   and bytes.
2. The remediation stack on the end-to-end harness (tests/e2e/harness: the template ``cdk synth``
   produces, the real state machine definition and Lambda handlers on moto): one alarm taken
   from the agent's publish to a replaced node, one sweeper run, one canary run. Every client
   made while it runs gets the same hook; a call is attributed to the function whose handler
   made it (the runtime's invocation thread), and calls made by the harness itself (the alarm
   evaluator standing in for CloudWatch, the test's polling) are reported apart and not priced.
   State transitions come from the execution history, Lambda invocations from the runtime,
   DynamoDB capacity units from the sizes of the items read and written, the functions' logs
   and Powertools EMF metrics from what they print.

Schedules, the health-check poll interval, Lambda memory and architecture, alarms and their
metrics are read from the template synthesized with the project's own cdk.json context; the
liveness interval from ``PublishSettings``. ``--skip-pipeline`` measures the agent only (no
synth, no Node.js); ``--load`` prices a measurement saved with ``--json PATH`` under other
assumptions without measuring again. The prices are a table in this file (PRICES), with their
region and the date they were written down; docs/cost.md shows the output and what it assumes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# ----------------------------------------------------------------------------------- prices

PRICES_REGION = "us-east-1"
PRICES_DATE = "2026-12-01"
"""The day this table was written down: list prices as known then, NOT fetched (this machine
has no internet). Check them against the AWS pricing pages for CloudWatch, AWS Lambda, AWS Step
Functions, Amazon DynamoDB, Amazon SNS, AWS X-Ray, AWS KMS and Amazon EventBridge."""

PRICES: dict[str, float] = {
    # Amazon CloudWatch
    "custom_metric_month": 0.30,  # first 10,000 metrics; pro-rated by the hour with data
    "alarm_metric_month_standard": 0.10,  # per metric an alarm evaluates (60 s period)
    "alarm_metric_month_high_res": 0.30,  # period under 60 s
    "dashboard_month": 3.00,  # per dashboard beyond the account's first 3
    "cw_requests_per_1k": 0.01,  # PutMetricData, ListMetrics, DescribeAlarms, ...
    "get_metric_data_per_1k_metrics": 0.01,  # GetMetricData: per metric requested
    "logs_ingest_gb": 0.50,  # standard and vended (Step Functions) logs, first 10 TB
    "logs_storage_gb_month": 0.03,
    # AWS Lambda (arm64, the stack's architecture)
    "lambda_per_1m_requests": 0.20,
    "lambda_gb_second_arm": 0.0000133334,
    # AWS Step Functions, Standard workflows
    "sfn_per_1k_transitions": 0.025,
    # Amazon DynamoDB on-demand (the stack's billing mode). These are the prices before the
    # November 2024 cut; the cut halved the write price, so these are an upper bound.
    "ddb_per_1m_wru": 1.25,
    "ddb_per_1m_rru": 0.25,
    # Amazon SNS
    "sns_per_1m_publishes": 0.50,
    "sns_email_per_100k": 2.00,  # deliveries to email endpoints, beyond the first 1,000
    # AWS X-Ray (active tracing on the functions and the state machine)
    "xray_per_1m_traces": 5.00,
    # AWS KMS (the topic's customer managed key)
    "kms_key_month": 1.00,
    "kms_per_10k_requests": 0.03,
    # Amazon EventBridge Scheduler (sweeper, canary)
    "scheduler_per_1m_invocations": 1.00,
}

HOURS_PER_MONTH = 730.0
DAYS_PER_MONTH = HOURS_PER_MONTH / 24.0

# ----------------------------------------------------------------------------------- counting


@dataclasses.dataclass
class Calls:
    """What one caller's AWS calls amounted to."""

    operations: Counter = dataclasses.field(default_factory=Counter)
    """``service:Operation`` -> calls."""
    datapoints: int = 0
    """PutMetricData entries sent."""
    series: Counter = dataclasses.field(default_factory=Counter)
    """(namespace, metric, dimensions) -> datapoints PutMetricData wrote to that series."""
    metrics_requested: int = 0
    """GetMetricData queries with a MetricStat or expression (what GetMetricData bills)."""
    log_events: int = 0
    log_bytes: int = 0
    """PutLogEvents: message bytes plus the 26 bytes per event CloudWatch Logs counts."""
    sns_publishes: int = 0
    ddb_writes: list = dataclasses.field(default_factory=list)
    """(table, key, transactional) per item written."""
    ddb_rru: float = 0.0
    """Read units from the items the responses carried (see :func:`read_units`)."""
    scans: list = dataclasses.field(default_factory=list)
    """(table, consistent) per Scan: billed on the table's size, not on what it returned."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (series as a count)."""
        return {
            "operations": dict(sorted(self.operations.items())),
            "put_metric_data_datapoints": self.datapoints,
            "distinct_series": len(self.series),
            "get_metric_data_metrics": self.metrics_requested,
            "log_events": self.log_events,
            "log_bytes": self.log_bytes,
            "sns_publishes": self.sns_publishes,
            "ddb_item_writes": len(self.ddb_writes),
            "ddb_rru": round(self.ddb_rru, 2),
        }


LOG_EVENT_OVERHEAD = 26
"""Bytes CloudWatch Logs adds to each event's message when it meters a batch."""


def series_key(namespace: str, datum: dict[str, Any]) -> tuple[Any, ...]:
    """One custom metric: its namespace, name and dimension set (order-free)."""
    dims = tuple(sorted((d["Name"], d["Value"]) for d in datum.get("Dimensions", [])))
    return (namespace, datum["MetricName"], dims)


def dynamo_item_size(item: dict[str, Any]) -> int:
    """Bytes of a DynamoDB item in its typed JSON form, by the sizing rules of the developer
    guide: attribute names plus values (strings in UTF-8, numbers about 1 byte per 2 digits + 1,
    3 bytes of overhead per map or list plus their contents)."""

    def value_size(value: dict[str, Any]) -> int:
        ((kind, raw),) = value.items()
        if kind in ("S", "B"):
            return len(str(raw).encode())
        if kind == "N":
            return math.ceil(len(str(raw).lstrip("-").replace(".", "")) / 2) + 1
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "M":
            return 3 + sum(len(k.encode()) + value_size(v) for k, v in raw.items())
        if kind == "L":
            return 3 + sum(1 + value_size(v) for v in raw)
        if kind in ("SS", "NS", "BS"):
            return sum(value_size({kind[0]: v}) for v in raw)
        return len(json.dumps(raw))

    return sum(len(k.encode()) + value_size(v) for k, v in item.items())


def read_units(sizes: list[int], *, consistent: bool, transactional: bool = False) -> float:
    """On-demand read request units for one request that returned items of ``sizes`` bytes:
    4 KB per unit (a Query or Scan sums its items first), halved for eventually consistent
    reads, doubled for transactions; an empty read still costs one unit's share."""
    units = max(1, math.ceil(sum(sizes) / 4096))
    if transactional:
        return 2.0 * units
    return float(units) if consistent else units / 2.0


def write_units(size: int, *, transactional: bool) -> int:
    """On-demand write request units for writing one item of ``size`` bytes (1 KB per unit,
    doubled in a transaction)."""
    units = max(1, math.ceil(size / 1024))
    return 2 * units if transactional else units


class CallCounter:
    """Counts AWS calls by caller through botocore's ``before-call`` / ``after-call`` events.

    ``attach(client)`` hooks one client; while the counter is ``installed()``, every botocore
    client created in the process is hooked as it is made. A call is counted under the label
    the calling thread holds (``with counter.labelled("localize"):``), else ``default``.
    """

    def __init__(self, default: str = "harness") -> None:
        self.default = default
        self.by_label: dict[str, Calls] = defaultdict(Calls)
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextlib.contextmanager
    def labelled(self, label: str) -> Iterator[None]:
        """Count the calls this thread makes in the block under ``label``."""
        previous = getattr(self._local, "label", None)
        self._local.label = label
        try:
            yield
        finally:
            self._local.label = previous

    def label(self) -> str:
        """The calling thread's label."""
        return getattr(self._local, "label", None) or self.default

    def attach(self, client: Any) -> Any:
        """Hook ``client``; returns it."""
        service = client.meta.service_model.service_name
        events = client.meta.events
        tag = f"cost-{id(self)}"
        # The API parameters are seen before they are serialised; the call is counted at
        # before-call (once per attempt the caller makes), its response read at after-call.
        events.register("before-parameter-build", _keep_params, unique_id=f"{tag}-p")
        events.register(
            "before-call", lambda **kw: self._before(service, **kw), unique_id=f"{tag}-b"
        )
        events.register("after-call", lambda **kw: self._after(service, **kw), unique_id=f"{tag}-a")
        return client

    @contextlib.contextmanager
    def installed(self) -> Iterator[CallCounter]:
        """Hook every botocore client created in the block."""
        import botocore.session

        original = botocore.session.Session.create_client
        counter = self

        def create_client(session: Any, *args: Any, **kwargs: Any) -> Any:
            return counter.attach(original(session, *args, **kwargs))

        botocore.session.Session.create_client = create_client  # type: ignore[method-assign]
        try:
            yield self
        finally:
            botocore.session.Session.create_client = original  # type: ignore[method-assign]

    def snapshot(self) -> dict[str, Calls]:
        """A deep copy of the counts so far (to subtract a phase's start)."""
        with self._lock:
            return {
                k: dataclasses.replace(
                    v,
                    operations=Counter(v.operations),
                    series=Counter(v.series),
                    scans=list(v.scans),
                    ddb_writes=list(v.ddb_writes),
                )
                for k, v in self.by_label.items()
            }

    def _before(self, service: str, *, model: Any, context: dict[str, Any], **_: Any) -> None:
        op = model.name
        params = context.get(_PARAMS_KEY, {})
        with self._lock:
            calls = self.by_label[self.label()]
            calls.operations[f"{service}:{op}"] += 1
            if service == "cloudwatch" and op == "PutMetricData":
                data = params.get("MetricData", [])
                calls.datapoints += len(data)
                calls.series.update(series_key(params["Namespace"], d) for d in data)
            elif service == "cloudwatch" and op == "GetMetricData":
                calls.metrics_requested += sum(
                    1 for q in params.get("MetricDataQueries", []) if "MetricStat" in q
                ) + sum(1 for q in params.get("MetricDataQueries", []) if "Expression" in q)
            elif service == "logs" and op == "PutLogEvents":
                events = params.get("logEvents", [])
                calls.log_events += len(events)
                calls.log_bytes += sum(
                    len(e["message"].encode()) + LOG_EVENT_OVERHEAD for e in events
                )
            elif service == "sns" and op in ("Publish", "PublishBatch"):
                calls.sns_publishes += len(params.get("PublishBatchRequestEntries", [None]))
            elif service == "dynamodb":
                calls.ddb_writes.extend(_written_items(op, params))

    def _after(self, service: str, *, model: Any, parsed: dict[str, Any], **kw: Any) -> None:
        if service != "dynamodb":
            return
        context = kw.get("context", {})
        params = context.get(_PARAMS_KEY, {})
        if model.name == "Scan" and "Error" not in parsed:
            # A Scan reads the whole table (or segment) whatever its filter keeps: its units are
            # the table's bytes / 4 KB, known only from the table (see _phase).
            with self._lock:
                self.by_label[self.label()].scans.append(
                    (params.get("TableName", ""), bool(params.get("ConsistentRead")))
                )
        units = _read_units_of(model.name, params, parsed)
        if units:
            with self._lock:
                self.by_label[self.label()].ddb_rru += units


_PARAMS_KEY = "sdc_cost_params"


def _keep_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """Keep the call's API parameters in its context for the before-call counter."""
    context[_PARAMS_KEY] = params


def _written_items(op: str, params: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(table, key, transactional) of every item a DynamoDB write request writes."""

    def key(k: dict[str, Any]) -> str:
        return json.dumps(k, sort_keys=True)

    if op == "PutItem":
        return [(params["TableName"], _key_of(params["TableName"], params["Item"]), False)]
    if op in ("UpdateItem", "DeleteItem"):
        return [(params["TableName"], key(params["Key"]), False)]
    if op == "TransactWriteItems":
        out = []
        for item in params.get("TransactItems", []):
            ((kind, body),) = item.items()
            if kind == "Put":
                out.append((body["TableName"], _key_of(body["TableName"], body["Item"]), True))
            else:  # Update, Delete, ConditionCheck (a check is billed as a write)
                out.append((body["TableName"], key(body["Key"]), True))
        return out
    if op == "BatchWriteItem":
        out = []
        for table, requests in params.get("RequestItems", {}).items():
            for request in requests:
                ((kind, body),) = request.items()
                item = body.get("Item") or body.get("Key")
                out.append((table, _key_of(table, item), False))
        return out
    return []


_KEY_NAMES: dict[str, tuple[str, ...]] = {}
"""Table -> its key attribute names (filled by :func:`register_table_keys`)."""


def register_table_keys(table: str, names: tuple[str, ...]) -> None:
    """Tell the counter which attributes of ``table``'s items are its key."""
    _KEY_NAMES[table] = names


def _key_of(table: str, item: dict[str, Any]) -> str:
    names = _KEY_NAMES.get(table, ("pk", "sk"))
    return json.dumps({n: item[n] for n in names if n in item}, sort_keys=True)


def _read_units_of(op: str, params: dict[str, Any], parsed: dict[str, Any]) -> float:
    if "Error" in parsed:
        return 0.0
    consistent = bool(params.get("ConsistentRead"))
    if op == "GetItem":
        item = parsed.get("Item")
        return read_units([dynamo_item_size(item)] if item else [], consistent=consistent)
    if op == "Scan":
        return 0.0  # billed on every item scanned, not the filtered answer: see scans
    if op == "Query":
        # A Query's filter drops few here (its key condition selects); its answer's items.
        return read_units(
            [dynamo_item_size(i) for i in parsed.get("Items", [])], consistent=consistent
        )
    if op == "TransactGetItems":
        return sum(
            read_units(
                [dynamo_item_size(r["Item"])] if r.get("Item") else [],
                consistent=True,
                transactional=True,
            )
            for r in parsed.get("Responses", [])
        )
    if op == "BatchGetItem":
        return sum(
            read_units([dynamo_item_size(i)], consistent=False)
            for items in parsed.get("Responses", {}).values()
            for i in items
        )
    return 0.0


def diff(after: dict[str, Calls], before: dict[str, Calls]) -> dict[str, Calls]:
    """What each label did between two snapshots."""
    out: dict[str, Calls] = {}
    for label, calls in after.items():
        base = before.get(label, Calls())
        delta = Calls(
            operations=calls.operations - base.operations,
            datapoints=calls.datapoints - base.datapoints,
            series=calls.series - base.series,
            metrics_requested=calls.metrics_requested - base.metrics_requested,
            log_events=calls.log_events - base.log_events,
            log_bytes=calls.log_bytes - base.log_bytes,
            sns_publishes=calls.sns_publishes - base.sns_publishes,
            ddb_writes=calls.ddb_writes[len(base.ddb_writes) :],
            ddb_rru=calls.ddb_rru - base.ddb_rru,
            scans=calls.scans[len(base.scans) :],
        )
        if delta.operations:
            out[label] = delta
    return out


# ------------------------------------------------------------------------- the agent, measured


def _rank_infos(nodes: int, gpus_per_node: int) -> dict[int, Any]:
    """Placements named as on HyperPod: 17-hex instance ids, NVIDIA-style GPU UUIDs, Kubeflow
    pod names (their lengths are what the log bytes depend on)."""
    import sdc_agent as sdc

    return {
        rank: sdc.RankInfo(
            rank=rank,
            node_name=f"hyperpod-i-{rank // gpus_per_node:017x}",
            instance_id=f"i-{rank // gpus_per_node:017x}",
            gpu_uuid=f"GPU-{rank:08x}-1c2d-3e4f-5a6b-{rank:012x}",
            local_rank=rank % gpus_per_node,
            pod_name=f"llama-pretrain-worker-{rank // gpus_per_node}",
        )
        for rank in range(nodes * gpus_per_node)
    }


def _culprit_alarm(ranks: dict[int, Any], culprit: int, peer: int) -> Any:
    """A ring-replay alarm naming one rank, as the agent reports one: the culprit mismatches
    both its comparisons (with the rank it replays and the rank replaying it)."""
    import sdc_agent as sdc

    n = len(ranks)
    before, after = (culprit - peer) % n, (culprit + peer) % n
    return sdc.Alarm(
        step=12_000,
        check="compute",
        mismatched_pairs=[(culprit, after), (before, culprit)],
        culprits=[culprit],
        suspects=[culprit],
        suspect_window=(11_990, 12_000),
        last_audit_pass=11_990,
        last_weight_check_pass=11_999,
        ranks={str(r): ranks[r] for r in sorted({culprit, before, after})},
    )


def measure_agent(*, ranks_per_job: int, gpus_per_node: int) -> dict[str, Any]:
    """One job's DP rank 0 publishing to an in-process moto: the rank map of ``ranks_per_job``
    ranks, liveness for a few intervals, and one alarm naming one node."""
    import boto3
    from moto import mock_aws

    from sdc_agent.publish import CloudWatchPublisher, PublishSettings

    counter = CallCounter(default="agent")
    default_interval = PublishSettings.__dataclass_fields__["liveness_interval"].default
    nodes = max(1, ranks_per_job // gpus_per_node)
    ranks = _rank_infos(nodes, gpus_per_node)
    out: dict[str, Any] = {"liveness_interval_s": default_interval, "ranks": len(ranks)}
    with tempfile.TemporaryDirectory() as spool, mock_aws():
        cloudwatch = counter.attach(boto3.client("cloudwatch", region_name=PRICES_REGION))
        logs = counter.attach(boto3.client("logs", region_name=PRICES_REGION))
        # The stack creates the report log group (infra/constructs/reports.py); the agent
        # creates its job's stream on first use.
        logs.create_log_group(logGroupName="/sdc/cost-cluster")

        def publisher(**options: Any) -> Any:
            return CloudWatchPublisher(
                cluster_name="cost-cluster",
                job_name="llama-pretrain",
                spool_dir=spool,
                cloudwatch_client=cloudwatch,
                logs_client=logs,
                **options,
            )

        start = counter.snapshot()
        pub = publisher()
        pub.publish_rank_map(ranks)
        assert pub.flush(60), "rank map not delivered"
        pub.close(5)
        out["rank_map"] = diff(counter.snapshot(), start)["agent"].to_dict()

        # Liveness: the guard calls publish_liveness after every passing step; the sender puts
        # at most one batch per interval. A short interval and steps every few ms show the
        # batching; per hour it is 3600 / the default interval sends of this size.
        interval, run_for = 0.5, 3.0
        start = counter.snapshot()
        pub = publisher(liveness_interval=interval)
        began, step = time.monotonic(), 0
        while time.monotonic() - began < run_for:
            pub.publish_liveness(step, 1, 1 if step % 10 == 0 else 0)
            step += 1
            time.sleep(0.005)
        elapsed = time.monotonic() - began
        pub.close(10)
        live = diff(counter.snapshot(), start)["agent"]
        sends = live.operations["cloudwatch:PutMetricData"]
        out["liveness"] = {
            **live.to_dict(),
            "steps": step,
            "intervals": round(elapsed / interval, 2),
            "sends_per_interval": round(sends / (elapsed / interval), 2),
            "datapoints_per_send": live.datapoints / max(1, sends),
            "series": sorted(f"{m}{dict(d)}" for _, m, d in live.series),
        }

        start = counter.snapshot()
        pub = publisher()
        pub.publish_alarm(_culprit_alarm(ranks, culprit=min(3, len(ranks) - 1), peer=gpus_per_node))
        assert pub.flush(60), "alarm not delivered"
        pub.close(5)
        alarm = diff(counter.snapshot(), start)["agent"]
        out["alarm"] = {
            **alarm.to_dict(),
            "series": sorted(f"{m}{dict(d)}" for _, m, d in alarm.series),
        }
    out["rank_map_bytes_per_rank"] = out["rank_map"]["log_bytes"] / len(ranks)
    return out


# ---------------------------------------------------------------------- the stack, measured


class _OutputCapture:
    """Counts what the functions print (their JSON logs and Powertools' EMF metric lines), per
    calling function (the counter's thread label), without echoing it."""

    def __init__(self, counter: CallCounter, passthrough: Any) -> None:
        self.counter = counter
        self.passthrough = passthrough
        self.lock = threading.Lock()
        self.log_bytes: Counter = Counter()
        self.log_lines: Counter = Counter()
        self.emf: list[tuple[str, dict[str, Any]]] = []
        self._partial = threading.local()

    def write(self, text: str) -> int:
        label = self.counter.label()
        if label == self.counter.default:
            return self.passthrough.write(text)
        buffered = getattr(self._partial, "text", "") + text
        *lines, self._partial.text = buffered.split("\n")
        with self.lock:
            for line in lines:
                self.log_bytes[label] += len(line.encode()) + LOG_EVENT_OVERHEAD
                self.log_lines[label] += 1
                if line.startswith("{") and '"_aws"' in line:
                    with contextlib.suppress(ValueError):
                        self.emf.append((label, json.loads(line)))
        return len(text)

    def flush(self) -> None:
        self.passthrough.flush()

    def snapshot(self) -> tuple[Counter, Counter, int]:
        with self.lock:
            return Counter(self.log_bytes), Counter(self.log_lines), len(self.emf)


def emf_series(blobs: list[tuple[str, dict[str, Any]]]) -> Counter:
    """(namespace, metric, dimensions) -> datapoints of Powertools' EMF lines."""
    out: Counter = Counter()
    for _, blob in blobs:
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            for dimset in directive.get("Dimensions", []):
                dims = tuple(sorted((d, str(blob.get(d))) for d in dimset))
                for metric in directive["Metrics"]:
                    out[(directive["Namespace"], metric["Name"], dims)] += 1
    return out


def transitions_of(history: list[dict[str, Any]]) -> dict[str, Any]:
    """State transitions as Standard workflows bill them: every state entered (in a Map's
    iterations too) plus every retry of a task; and the states entered, by name."""
    entered = [e for e in history if e["type"].endswith("StateEntered")]
    scheduled = sum(1 for e in history if e["type"] in ("LambdaFunctionScheduled", "TaskScheduled"))
    tasks = sum(1 for e in entered if e["type"] == "TaskStateEntered")
    names = Counter(e["stateEnteredEventDetails"]["name"] for e in entered)
    return {"transitions": len(entered) + max(0, scheduled - tasks), "states": dict(names)}


def state_log_bytes(history: list[dict[str, Any]], execution_arn: str) -> int:
    """Bytes Step Functions' log delivery writes at level ALL without execution data: one
    record per history event (its type, ids, timestamp, the execution ARN and the event's
    details less their input and output)."""
    total = 0
    for event in history:
        details = {
            k: {
                dk: dv
                for dk, dv in v.items()
                if dk not in ("input", "output", "inputDetails", "outputDetails")
            }
            for k, v in event.items()
            if k.endswith("EventDetails") and isinstance(v, dict)
        }
        record = {
            "id": str(event["id"]),
            "type": event["type"],
            "details": next(iter(details.values()), {}),
            "previous_event_id": str(event.get("previousEventId", 0)),
            "event_timestamp": str(int(time.time() * 1000)),
            "execution_arn": execution_arn,
            "redrive_count": "0",
        }
        total += len(json.dumps(record).encode()) + LOG_EVENT_OVERHEAD
    return total


def _phase(
    pipeline: Any,
    counter: CallCounter,
    capture: _OutputCapture,
    run: Callable[[], list[str]],
) -> dict[str, Any]:
    """Run one phase; returns what each function did in it (calls, invocations and their
    durations, transitions and state log bytes of the executions it started, logs, EMF)."""
    before, logs_before, lines_before, emf_before = (
        counter.snapshot(),
        *capture.snapshot(),
    )
    invoked_before = len(pipeline.invocations)
    kept_before, expiring_before = _ledger_bytes(pipeline)
    executions = run()
    # The workflow's last record step may still be returning when the execution ends.
    time.sleep(0.5)
    calls = diff(counter.snapshot(), before)
    logs_after, lines_after, _ = capture.snapshot()
    invocations = pipeline.invocations[invoked_before:]
    per_function: dict[str, dict[str, Any]] = {}
    for inv in invocations:
        f = per_function.setdefault(inv.folder, {"invocations": 0, "seconds": 0.0, "errors": 0})
        f["invocations"] += 1
        f["seconds"] += inv.ended - inv.started
        f["errors"] += inv.error is not None
    for label, f in per_function.items():
        f["seconds"] = round(f["seconds"], 3)
        f["log_bytes"] = logs_after[label] - logs_before[label]
        f["log_lines"] = lines_after[label] - lines_before[label]
        if label in calls:
            f["calls"] = calls[label].to_dict()
    transitions, states, sfn_log_bytes = 0, Counter(), 0
    for arn in executions:
        history = pipeline.history(arn)
        counted = transitions_of(history)
        transitions += counted["transitions"]
        states.update(counted["states"])
        sfn_log_bytes += state_log_bytes(history, arn)
    emf = emf_series(capture.emf[emf_before:])
    functions = {k: v for k, v in calls.items() if k != counter.default}
    ddb_wru = 0
    items = _final_item_sizes(pipeline)
    table_bytes: Counter = Counter()
    for (table, _), size in items.items():
        table_bytes[table] += size
    scan_rru = 0.0
    for c in functions.values():
        for table, key, transactional in c.ddb_writes:
            ddb_wru += write_units(items.get((table, key), 0), transactional=transactional)
        for table, consistent in c.scans:
            scan_rru += read_units([table_bytes[table]], consistent=consistent)
    return {
        "executions": len(executions),
        "transitions": transitions,
        "states": dict(sorted(states.items())),
        "state_log_bytes": sfn_log_bytes,
        "functions": dict(sorted(per_function.items())),
        "invocations": sum(f["invocations"] for f in per_function.values()),
        "invocations_outside_workflows": sum(
            1 for inv in invocations if inv.folder in ("sweeper", "canary", "approve")
        ),
        "lambda_gb_seconds": round(
            sum(f["seconds"] * pipeline.memory_mb[k] / 1024 for k, f in per_function.items()), 4
        ),
        "lambda_log_bytes": sum(f["log_bytes"] for f in per_function.values()),
        "emf_series": {f"{ns}:{m}{dict(d)}": n for (ns, m, d), n in sorted(emf.items())},
        "put_metric_data_series": {
            f"{ns}:{m}{dict(d)}": n
            for c in functions.values()
            for (ns, m, d), n in sorted(c.series.items())
        },
        "operations": dict(
            sorted(sum((c.operations for c in functions.values()), Counter()).items())
        ),
        "get_metric_data_metrics": sum(c.metrics_requested for c in functions.values()),
        "sns_publishes": sum(c.sns_publishes for c in functions.values()),
        "ddb_wru": ddb_wru,
        "ddb_rru": round(sum(c.ddb_rru for c in functions.values()) + scan_rru, 2),
        "scans": sum(len(c.scans) for c in functions.values()),
        "scan_rru": scan_rru,
        **_ledger_growth(pipeline, kept_before, expiring_before),
        "harness_operations": dict(sorted(calls[counter.default].operations.items()))
        if counter.default in calls
        else {},
    }


def _ledger_bytes(pipeline: Any) -> tuple[int, int]:
    """The ledger's bytes in items kept for good, and in items its TTL removes (canary runs)."""
    kept = expiring = 0
    for page in (
        pipeline.client("dynamodb")
        .get_paginator("scan")
        .paginate(TableName=pipeline.tables["ledger"])
    ):
        for item in page["Items"]:
            if "expires_at" in item:
                expiring += dynamo_item_size(item)
            else:
                kept += dynamo_item_size(item)
    return kept, expiring


def _ledger_growth(pipeline: Any, kept_before: int, expiring_before: int) -> dict[str, int]:
    kept, expiring = _ledger_bytes(pipeline)
    return {
        "ledger_bytes_before": kept_before + expiring_before,
        "ledger_kept_added": kept - kept_before,
        "ledger_expiring_added": expiring - expiring_before,
    }


def _final_item_sizes(pipeline: Any) -> dict[tuple[str, str], int]:
    """(table, key) -> the item's size now (an update is billed on the larger of the item
    before and after; items here only grow, so their final size is the one billed)."""
    ddb = pipeline.client("dynamodb")
    sizes: dict[tuple[str, str], int] = {}
    for table in pipeline.tables.values():
        for page in ddb.get_paginator("scan").paginate(TableName=table):
            for item in page["Items"]:
                sizes[(table, _key_of(table, item))] = dynamo_item_size(item)
    return sizes


def production_settings(template: dict[str, Any]) -> dict[str, Any]:
    """What the cost depends on in the template `cdk synth` makes from cdk.json's context:
    schedules, the poll interval, functions' memory, alarms and their metrics, log retention."""
    from infra.template import function_logical_ids

    resources = template["Resources"]
    logical = {v: k for k, v in function_logical_ids(template).items()}
    memory = {
        logical[k]: r["Properties"].get("MemorySize", 128)
        for k, r in resources.items()
        if k in logical
    }
    arch = {
        r["Properties"].get("Architectures", ["x86_64"])[0]
        for k, r in resources.items()
        if k in logical
    }
    schedules = {}
    for r in resources.values():
        if r["Type"] != "AWS::Scheduler::Schedule":
            continue
        target = r["Properties"]["Target"]["Arn"]
        folder = next((logical[t] for t in logical if t in json.dumps(target)), json.dumps(target))
        schedules[folder] = _rate_seconds(r["Properties"]["ScheduleExpression"])
    alarms = []
    for r in resources.values():
        if r["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = r["Properties"]
        name = props.get("AlarmName", "?")
        if isinstance(name, dict):
            name = json.dumps(name)
        if "Metrics" in props:
            stats = [m for m in props["Metrics"] if "MetricStat" in m]
            insights = [m for m in props["Metrics"] if "SELECT" in m.get("Expression", "")]
            periods = [m["MetricStat"]["Period"] for m in stats] + [
                m.get("Period", 60) for m in insights
            ]
            alarms.append(
                {
                    "name": name,
                    "metrics": len(stats),
                    "insights_query": bool(insights),
                    "period": min(periods),
                }
            )
        else:
            alarms.append(
                {
                    "name": name,
                    "metrics": 1,
                    "insights_query": False,
                    "period": props.get("Period", 60),
                }
            )
    definition = json.dumps(
        next(r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine")[
            "Properties"
        ]["DefinitionString"]
    )
    poll = re.search(
        r'WaitForHealthCheck\\\\?"\s*:\s*\{\\\\?"Type\\\\?"\s*:\s*\\\\?"Wait\\\\?"\s*,'
        r'\s*\\\\?"Seconds\\\\?"\s*:\s*(\d+)',
        definition,
    )
    retention = {
        r["Properties"].get("RetentionInDays")
        for r in resources.values()
        if r["Type"] == "AWS::Logs::LogGroup"
    }
    return {
        "memory_mb": dict(sorted(memory.items())),
        "architectures": sorted(arch),
        "schedules_s": schedules,
        "alarms": alarms,
        "dashboards": sum(
            1 for r in resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"
        ),
        "kms_keys": sum(1 for r in resources.values() if r["Type"] == "AWS::KMS::Key"),
        "health_check_poll_s": int(poll.group(1)) if poll else None,
        "log_retention_days": max((d for d in retention if d), default=None),
    }


def _rate_seconds(expression: str) -> int:
    """``rate(15 minutes)`` -> 900."""
    match = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", expression)
    if not match:
        raise ValueError(f"not a rate expression: {expression!r}")
    unit = {"minute": 60, "hour": 3600, "day": 86400}[match.group(2).rstrip("s")]
    return int(match.group(1)) * unit


def measure_stack(*, cluster_nodes: int) -> dict[str, Any]:
    """The harness with the real workflow: one alarm (publish, localize, ..., approve,
    replace), one sweeper run, one canary run; and the production template's settings."""
    from tests.e2e.harness import runtime as harness_runtime
    from tests.e2e.harness.canary import LocalCanary
    from tests.e2e.harness.pipeline import LocalPipeline, template_for
    from tests.e2e.scenario import culprit_alarm, local_cluster, operator, pending_for, raise_alarm

    production = production_settings(template_for({}))
    counter = CallCounter(default="harness")
    capture = _OutputCapture(counter, sys.stdout)
    original_run = harness_runtime.LambdaRuntime._run

    def labelled_run(runtime: Any, function_name: str, *args: Any, **kwargs: Any) -> Any:
        function = runtime.functions.get(function_name.rsplit(":", 1)[-1])
        label = function.folder if function else function_name
        with counter.labelled(label):
            return original_run(runtime, function_name, *args, **kwargs)

    from sdc_remediation.observability import logger

    cluster = local_cluster(nodes=cluster_nodes)
    handler = logger.registered_handler
    old_stream = handler.stream
    from sdc_remediation.dal.canary_runs import RUN_RETENTION_SECONDS

    out: dict[str, Any] = {
        "cluster_nodes": cluster_nodes,
        "production": production,
        "canary_run_retention_s": RUN_RETENTION_SECONDS,
    }
    with contextlib.ExitStack() as stack:
        stack.enter_context(counter.installed())
        harness_runtime.LambdaRuntime._run = labelled_run  # type: ignore[method-assign]
        stack.callback(setattr, harness_runtime.LambdaRuntime, "_run", original_run)
        handler.setStream(capture)
        stack.callback(handler.setStream, old_stream)
        sys.stdout = capture  # Powertools prints its EMF lines
        stack.callback(setattr, sys, "stdout", capture.passthrough)
        # Three polls of the deep health check (1 s apart, a 2.5 s check), so the poll loop's
        # transitions can be read off the history and scaled to a real check's length.
        pipeline = stack.enter_context(
            LocalPipeline(cluster, retry_interval_seconds=1, health_check_seconds=2.5)
        )
        pipeline.memory_mb = production["memory_mb"]
        for logical_id, table in pipeline.template["Resources"].items():
            if table["Type"] == "AWS::DynamoDB::Table":
                keys = tuple(k["AttributeName"] for k in table["Properties"]["KeySchema"])
                register_table_keys(f"{logical_id}-local", keys)  # the harness's table name
        spool = stack.enter_context(tempfile.TemporaryDirectory())

        def one_alarm() -> list[str]:
            execution = raise_alarm(pipeline, culprit_alarm(cluster, [3]), spool)
            approval = pending_for(pipeline, execution)
            code, text = operator(pipeline, "approve", approval, "--reason", "cost measurement")
            if code != 0:
                raise RuntimeError(f"approve failed: {text}")
            if pipeline.finish(execution)["status"] != "SUCCEEDED":
                raise RuntimeError("the alarm's execution did not succeed")
            return [execution]

        def one_sweep() -> list[str]:
            pipeline.invoke("sweeper", {})
            return []

        def one_canary() -> list[str]:
            canary = LocalCanary(pipeline)
            canary.start()
            fired = pipeline.evaluator.evaluate()
            if len(fired) != 1:
                raise RuntimeError(f"the canary's alarm fired {len(fired)} times")
            execution = pipeline.executions[-1]
            if pipeline.finish(execution)["status"] != "SUCCEEDED":
                raise RuntimeError("the canary's execution did not succeed")
            return [execution]

        out["alarm"] = _phase(pipeline, counter, capture, one_alarm)
        out["sweep"] = _phase(pipeline, counter, capture, one_sweep)
        out["canary"] = _phase(pipeline, counter, capture, one_canary)
        out["poll_loop_transitions"] = _poll_loop_length(pipeline.history(pipeline.executions[0]))
    return out


def _poll_loop_length(history: list[dict[str, Any]]) -> int:
    """Transitions from one PollHealthCheck entry to the next (the wait-poll-decide loop)."""
    entered = [
        e["stateEnteredEventDetails"]["name"] for e in history if e["type"].endswith("StateEntered")
    ]
    polls = [i for i, name in enumerate(entered) if name == "PollHealthCheck"]
    if len(polls) < 2:
        raise RuntimeError(f"the health check was polled {len(polls)} time(s); need 2 to measure")
    return polls[1] - polls[0]


# ------------------------------------------------------------------------------- the arithmetic


@dataclasses.dataclass(frozen=True, kw_only=True)
class Assumptions:
    """What the measurements cannot say about a real cluster (docs/cost.md names each)."""

    nodes_per_job: int = 64
    """Nodes of one training job: the agent publishes per job (its DP rank 0), not per node."""
    gpus_per_node: int = 8
    """Ranks per node (the rank map's size)."""
    job_starts_per_day: float = 1.0
    """Each (re)start of a job publishes its rank map once."""
    health_check_minutes: float = 120.0
    """How long a real deep health check runs (polled at the template's interval)."""
    email_subscribers: int = 1
    """Email endpoints subscribed to the topic."""
    ledger_months: float = 12.0
    """Months of history in the ledger when the bill is read: the sweeper scans the whole
    ledger every run, and remediation events stay in it (only canary runs and approvals
    expire)."""
    lambda_seconds: float = 1.0
    """Billed seconds per invocation at least: the harness runs handlers in-process against
    local stand-ins (milliseconds); in AWS each call to a service takes tens of ms and a cold
    start's init is billed too. The measured time is used when it is longer."""

    def __post_init__(self) -> None:
        for name in ("nodes_per_job", "gpus_per_node", "email_subscribers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Assumptions.{name} must be an integer >= 1")
        for name in (
            "job_starts_per_day",
            "health_check_minutes",
            "lambda_seconds",
            "ledger_months",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Assumptions.{name} must be >= 0")


CW_PRICED_PER_METRIC = {"cloudwatch:GetMetricData"}
"""GetMetricData is billed per metric requested; every other CloudWatch call per request. The
other services' calls are billed by what they carry (DynamoDB units, SNS publishes, Logs bytes)
or not at all (control-plane reads of SageMaker, EKS, STS, the Step Functions API)."""


@dataclasses.dataclass
class Usage:
    """Monthly usage of one part (the agents, the idle stack, the alarms), in billable units."""

    metric_months: float = 0.0
    alarm_metric_months_standard: float = 0.0
    alarm_metric_months_high_res: float = 0.0
    dashboards: int = 0
    cw_requests: float = 0.0
    cw_metrics_requested: float = 0.0
    log_bytes: float = 0.0
    lambda_requests: float = 0.0
    lambda_gb_seconds: float = 0.0
    transitions: float = 0.0
    ddb_wru: float = 0.0
    ddb_rru: float = 0.0
    sns_publishes: float = 0.0
    sns_emails: float = 0.0
    xray_traces: float = 0.0
    kms_keys: int = 0
    kms_requests: float = 0.0
    scheduler_invocations: float = 0.0

    def add(self, other: Usage, times: float = 1.0) -> Usage:
        """This plus ``times`` x ``other`` (a new Usage)."""
        return Usage(
            **{
                f.name: getattr(self, f.name) + times * getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )


def dollars(
    usage: Usage, prices: dict[str, float], *, log_retention_days: float
) -> dict[str, float]:
    """Monthly $ per service for ``usage`` (no free tier subtracted). Log storage is the steady
    state: a month of ingestion kept ``log_retention_days``, uncompressed (an upper bound)."""
    gb = usage.log_bytes / 1e9
    return {
        "CloudWatch metrics": usage.metric_months * prices["custom_metric_month"],
        "CloudWatch alarms": usage.alarm_metric_months_standard
        * prices["alarm_metric_month_standard"]
        + usage.alarm_metric_months_high_res * prices["alarm_metric_month_high_res"],
        "CloudWatch dashboard": usage.dashboards * prices["dashboard_month"],
        "CloudWatch API": usage.cw_requests / 1000 * prices["cw_requests_per_1k"]
        + usage.cw_metrics_requested / 1000 * prices["get_metric_data_per_1k_metrics"],
        "CloudWatch Logs": gb * prices["logs_ingest_gb"]
        + gb * (log_retention_days / DAYS_PER_MONTH) * prices["logs_storage_gb_month"],
        "Lambda": usage.lambda_requests / 1e6 * prices["lambda_per_1m_requests"]
        + usage.lambda_gb_seconds * prices["lambda_gb_second_arm"],
        "Step Functions": usage.transitions / 1000 * prices["sfn_per_1k_transitions"],
        "DynamoDB": usage.ddb_wru / 1e6 * prices["ddb_per_1m_wru"]
        + usage.ddb_rru / 1e6 * prices["ddb_per_1m_rru"],
        "SNS": usage.sns_publishes / 1e6 * prices["sns_per_1m_publishes"]
        + usage.sns_emails / 1e5 * prices["sns_email_per_100k"],
        "X-Ray": usage.xray_traces / 1e6 * prices["xray_per_1m_traces"],
        "KMS": usage.kms_keys * prices["kms_key_month"]
        + usage.kms_requests / 1e4 * prices["kms_per_10k_requests"],
        "EventBridge Scheduler": usage.scheduler_invocations
        / 1e6
        * prices["scheduler_per_1m_invocations"],
    }


def _cw_requests(operations: dict[str, int]) -> float:
    return float(
        sum(
            n
            for op, n in operations.items()
            if op.startswith("cloudwatch:") and op not in CW_PRICED_PER_METRIC
        )
    )


def agent_usage(
    agent: dict[str, Any], *, jobs: int, ranks_per_job: int, alarms_per_month: float, a: Assumptions
) -> Usage:
    """The agents of ``jobs`` jobs for a month: liveness series and their PutMetricData, rank
    maps at each start, and the alarms' metrics and reports."""
    live = agent["liveness"]
    sends_per_hour = 3600.0 / agent["liveness_interval_s"]
    alarm = agent["alarm"]
    starts = jobs * a.job_starts_per_day * DAYS_PER_MONTH
    return Usage(
        # Every liveness series gets data every interval: a whole metric-month each; an alarm's
        # series get one datapoint, billed for the hour it arrived in.
        metric_months=jobs * len(live["series"])
        + alarms_per_month * len(alarm["series"]) / HOURS_PER_MONTH,
        cw_requests=jobs * sends_per_hour * HOURS_PER_MONTH
        + alarms_per_month * alarm["operations"].get("cloudwatch:PutMetricData", 0),
        log_bytes=starts * agent["rank_map_bytes_per_rank"] * ranks_per_job
        + alarms_per_month * alarm["log_bytes"],
    )


def billed_gb_seconds(
    functions: dict[str, dict[str, Any]], memory_mb: dict[str, int], floor_s: float
) -> float:
    """GB-s of the invocations of each function: its measured seconds, at least ``floor_s`` per
    invocation, times its configured memory."""
    return sum(
        max(f["seconds"], floor_s * f["invocations"]) * memory_mb.get(name, 128) / 1024
        for name, f in functions.items()
    )


def phase_usage(
    phase: dict[str, Any],
    *,
    runs: float,
    scheduled: bool,
    metric_hours_per_series: float,
    gb_seconds: float,
    extra: dict[str, Any] | None = None,
) -> Usage:
    """``runs`` repetitions of a measured phase in a month; ``metric_hours_per_series`` is how
    many hours a month each custom metric series it writes (PutMetricData and EMF) has data;
    ``gb_seconds`` the Lambda GB-s of one run (:func:`billed_gb_seconds`)."""
    extra = extra or {}
    series = len(phase["emf_series"]) + len(phase["put_metric_data_series"])
    invocations = phase["invocations"] + extra.get("invocations", 0)
    return Usage(
        metric_months=series * min(HOURS_PER_MONTH, metric_hours_per_series) / HOURS_PER_MONTH,
        cw_requests=runs * _cw_requests(phase["operations"]),
        cw_metrics_requested=runs * phase["get_metric_data_metrics"],
        log_bytes=runs
        * (phase["lambda_log_bytes"] + phase["state_log_bytes"] + extra.get("log_bytes", 0)),
        lambda_requests=runs * invocations,
        lambda_gb_seconds=runs * (gb_seconds + extra.get("gb_seconds", 0.0)),
        transitions=runs * (phase["transitions"] + extra.get("transitions", 0)),
        ddb_wru=runs * phase["ddb_wru"],
        ddb_rru=runs * phase["ddb_rru"],
        sns_publishes=runs * phase["sns_publishes"],
        kms_requests=runs * phase["sns_publishes"],
        xray_traces=runs * (phase["executions"] + phase["invocations_outside_workflows"]),
        scheduler_invocations=runs if scheduled else 0.0,
    )


def poll_extrapolation(stack: dict[str, Any], a: Assumptions) -> dict[str, Any]:
    """What a real deep health check adds to the measured alarm: more polls of the same loop."""
    alarm = stack["alarm"]
    poll_s = stack["production"]["health_check_poll_s"]
    measured = alarm["states"].get("PollHealthCheck", 0)
    real = math.ceil(a.health_check_minutes * 60 / poll_s) if poll_s else measured
    extra = max(0, real - measured)
    poll = alarm["functions"].get(
        "poll_health_check", {"invocations": 1, "seconds": 0.0, "log_bytes": 0}
    )
    per = max(1, poll["invocations"])
    memory = stack["production"]["memory_mb"].get("poll_health_check", 256) / 1024
    return {
        "measured_polls": measured,
        "real_polls": real,
        "invocations": extra,
        "transitions": extra * stack["poll_loop_transitions"],
        "gb_seconds": extra * max(poll["seconds"] / per, a.lambda_seconds) * memory,
        "log_bytes": extra * poll["log_bytes"] / per,
    }


def _gb_s(stack: dict[str, Any], phase: str, a: Assumptions) -> float:
    return billed_gb_seconds(
        stack[phase]["functions"], stack["production"]["memory_mb"], a.lambda_seconds
    )


def ledger_bytes(stack: dict[str, Any], a: Assumptions, alarms_per_day: float) -> float:
    """The ledger's size after ``a.ledger_months``: what it held at the start, plus what each
    canary run and each remediation added in the measurement and keeps, plus the items its TTL
    removes (a canary run's own) for as long as they are kept."""
    canary_s = stack["production"]["schedules_s"].get("canary")
    days = a.ledger_months * DAYS_PER_MONTH
    kept_per_day = alarms_per_day * stack["alarm"]["ledger_kept_added"]
    expiring = alarms_per_day * stack["alarm"]["ledger_expiring_added"]
    if canary_s:
        kept_per_day += 86400 / canary_s * stack["canary"]["ledger_kept_added"]
        expiring += 86400 / canary_s * stack["canary"]["ledger_expiring_added"]
    retention_days = stack["canary_run_retention_s"] / 86400
    return (
        stack["alarm"]["ledger_bytes_before"]
        + days * kept_per_day
        + min(days, retention_days) * expiring
    )


def stack_idle_usage(stack: dict[str, Any], a: Assumptions, alarms_per_day: float = 0.0) -> Usage:
    """The stack with no alarm: its alarms, dashboard and key, the sweeper and the canary.
    ``alarms_per_day`` only sizes the ledger the sweeper scans."""
    prod = stack["production"]
    usage = Usage(dashboards=prod["dashboards"], kms_keys=prod["kms_keys"])
    for alarm in prod["alarms"]:
        # A Metrics Insights alarm is billed per metric its query analyzes: here each job's
        # series of one SDC metric, which exist only after a finding; counted as one.
        metrics = max(1, alarm["metrics"])
        if alarm["period"] < 60:
            usage.alarm_metric_months_high_res += metrics
        else:
            usage.alarm_metric_months_standard += metrics
    schedules = prod["schedules_s"]
    month_s = DAYS_PER_MONTH * 86400
    sweeps = month_s / schedules["sweeper"]
    sweep = dict(stack["sweep"])
    # Each sweep scans the ledger as it will be, not as small as in the measurement.
    sweep["ddb_rru"] += (
        read_units([int(ledger_bytes(stack, a, alarms_per_day))], consistent=True) * sweep["scans"]
        - sweep["scan_rru"]
    )
    usage = usage.add(
        phase_usage(
            sweep,
            runs=sweeps,
            scheduled=True,
            metric_hours_per_series=HOURS_PER_MONTH,
            gb_seconds=_gb_s(stack, "sweep", a),
        )
    )
    if "canary" in schedules:
        runs = month_s / schedules["canary"]
        usage = usage.add(
            phase_usage(
                stack["canary"],
                runs=runs,
                scheduled=True,
                metric_hours_per_series=runs,
                gb_seconds=_gb_s(stack, "canary", a),
            )
        )
    return usage


def stack_alarm_usage(stack: dict[str, Any], a: Assumptions, alarms_per_month: float) -> Usage:
    """``alarms_per_month`` remediations like the measured one, with a real health check."""
    extra = poll_extrapolation(stack, a)
    usage = phase_usage(
        stack["alarm"],
        runs=alarms_per_month,
        scheduled=False,
        metric_hours_per_series=alarms_per_month,
        gb_seconds=_gb_s(stack, "alarm", a),
        extra=extra,
    )
    usage.sns_emails = alarms_per_month * stack["alarm"]["sns_publishes"] * a.email_subscribers
    return usage


def monthly(
    agent: dict[str, Any],
    stack: dict[str, Any] | None,
    *,
    nodes: int,
    alarms_per_day: float,
    a: Assumptions,
    prices: dict[str, float] = PRICES,
) -> dict[str, dict[str, float]]:
    """Monthly $ per service for the agents and for the stack, at ``nodes`` nodes."""
    jobs = math.ceil(nodes / a.nodes_per_job)
    ranks_per_job = min(nodes, a.nodes_per_job) * a.gpus_per_node
    alarms_per_month = alarms_per_day * DAYS_PER_MONTH
    retention = (stack or {}).get("production", {}).get("log_retention_days") or 30
    out = {
        "agents": dollars(
            agent_usage(
                agent,
                jobs=jobs,
                ranks_per_job=ranks_per_job,
                alarms_per_month=alarms_per_month,
                a=a,
            ),
            prices,
            log_retention_days=retention,
        ),
    }
    if stack is not None:
        usage = stack_idle_usage(stack, a, alarms_per_day)
        if alarms_per_month:
            usage = usage.add(stack_alarm_usage(stack, a, alarms_per_month))
        out["stack"] = dollars(usage, prices, log_retention_days=retention)
    return out


def total(parts: dict[str, dict[str, float]]) -> float:
    """Sum over parts and services."""
    return sum(sum(p.values()) for p in parts.values())


# ----------------------------------------------------------------------------------- printing


def render(measured: dict[str, Any], nodes: list[int], a: Assumptions) -> str:
    """The tables docs/cost.md shows (Markdown)."""
    agent, stack = measured["agent"], measured.get("stack")
    lines = [
        f"Prices: {PRICES_REGION} list prices as known on {PRICES_DATE}, not fetched; "
        "no free tier subtracted.",
        f"Assumptions: {a.nodes_per_job} nodes per job, {a.gpus_per_node} GPUs per node, "
        f"{a.job_starts_per_day:g} job start(s) a day, a {a.health_check_minutes:g}-minute deep "
        f"health check, {a.email_subscribers} email subscriber(s), at least "
        f"{a.lambda_seconds:g} s billed per Lambda invocation.",
        "",
        "| nodes | jobs | agents, idle | stack, idle | total, idle | agents, 1 alarm/day "
        "| stack, 1 alarm/day | total, 1 alarm/day |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    scenarios = {}
    for n in nodes:
        idle = monthly(agent, stack, nodes=n, alarms_per_day=0, a=a)
        busy = monthly(agent, stack, nodes=n, alarms_per_day=1, a=a)
        scenarios[n] = (idle, busy)
        row = [f"{n:,}", f"{math.ceil(n / a.nodes_per_job)}"]
        for parts in (idle, busy):
            row += [
                f"${sum(parts['agents'].values()):,.2f}",
                f"${sum(parts.get('stack', {}).values()):,.2f}" if stack else "n/a",
                f"${total(parts):,.2f}",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per service, $ a month (agents + stack):", ""]
    header = "| service | " + " | ".join(f"{n:,} idle | {n:,} 1/day" for n in nodes) + " |"
    lines += [header, "|---|" + "---:|" * (2 * len(nodes))]
    services = list(next(iter(scenarios.values()))[0]["agents"])
    for service in services:
        cells = []
        for n in nodes:
            for parts in scenarios[n]:
                cells.append(f"{sum(p.get(service, 0.0) for p in parts.values()):,.4f}")
        lines.append(f"| {service} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(measured: dict[str, Any], a: Assumptions) -> str:
    """The measured counts, in words."""
    agent = measured["agent"]
    live, alarm, rmap = agent["liveness"], agent["alarm"], agent["rank_map"]
    out = [
        "Agent (one job's DP rank 0, moto):",
        f"  liveness: {live['operations'].get('cloudwatch:PutMetricData', 0)} PutMetricData in "
        f"{live['intervals']} intervals of {live['steps']} steps ({live['sends_per_interval']} "
        f"per interval; default interval {agent['liveness_interval_s']:g} s), "
        f"{live['datapoints_per_send']:g} datapoints each, series {live['series']}",
        f"  rank map of {agent['ranks']} ranks: {rmap['operations']} "
        f"{rmap['log_bytes']:,} bytes ({agent['rank_map_bytes_per_rank']:.0f} per rank)",
        f"  one alarm naming one node: {alarm['operations']}, {alarm['put_metric_data_datapoints']} "
        f"datapoints, {alarm['log_bytes']:,} log bytes, series {alarm['series']}",
    ]
    stack = measured.get("stack")
    if stack:
        prod = stack["production"]
        extra = poll_extrapolation(stack, a)
        out += [
            f"Stack (harness, {stack['cluster_nodes']} nodes; template from cdk.json's context):",
            f"  schedules (s): {prod['schedules_s']}; health-check poll every "
            f"{prod['health_check_poll_s']} s; memory (MB): {prod['memory_mb']}; "
            f"{prod['architectures']}; log retention {prod['log_retention_days']} days",
            f"  alarms: {[(x['name'], x['metrics'], x['period']) for x in prod['alarms']]}; "
            f"dashboards {prod['dashboards']}; KMS keys {prod['kms_keys']}",
        ]
        for name in ("alarm", "sweep", "canary"):
            p = stack[name]
            out.append(
                f"  per {name}: {p['transitions']} transitions, {p['invocations']} invocations "
                f"({p['lambda_gb_seconds']} GB-s), {p['lambda_log_bytes']:,} function log bytes, "
                f"{p['state_log_bytes']:,} state-machine log bytes, DynamoDB {p['ddb_wru']} WRU "
                f"{p['ddb_rru']} RRU, SNS {p['sns_publishes']}, GetMetricData metrics "
                f"{p['get_metric_data_metrics']}, EMF series {len(p['emf_series'])}, "
                f"PutMetricData series {len(p['put_metric_data_series'])}"
            )
            out.append(f"    calls: {p['operations']}")
            out.append(
                "    invocations: "
                + ", ".join(f"{k} x{v['invocations']}" for k, v in p["functions"].items())
            )
        out.append(
            f"  health check: {extra['measured_polls']} polls measured, {extra['real_polls']} "
            f"for a {a.health_check_minutes:g}-minute check: +{extra['transitions']} transitions "
            f"({stack['poll_loop_transitions']} per poll), +{extra['invocations']} invocations"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Measure, then print the counts and the monthly cost tables (or JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="the counts and costs as JSON: printed, or written to PATH",
    )
    parser.add_argument("--nodes", default="64,512,2048", help="cluster sizes, comma-separated")
    parser.add_argument("--nodes-per-job", type=int, default=Assumptions.nodes_per_job)
    parser.add_argument("--gpus-per-node", type=int, default=Assumptions.gpus_per_node)
    parser.add_argument(
        "--health-check-minutes", type=float, default=Assumptions.health_check_minutes
    )
    parser.add_argument(
        "--lambda-seconds",
        type=float,
        default=Assumptions.lambda_seconds,
        help="billed seconds per Lambda invocation at least",
    )
    parser.add_argument(
        "--cluster-nodes", type=int, default=6, help="nodes of the harness's simulated cluster"
    )
    parser.add_argument(
        "--ledger-months",
        type=float,
        default=Assumptions.ledger_months,
        help="months of remediation history in the ledger the sweeper scans",
    )
    parser.add_argument(
        "--liveness-interval",
        type=float,
        help="price the agents as if CloudWatchPublisher(liveness_interval=...) were set "
        "(seconds; default: PublishSettings' default)",
    )
    parser.add_argument(
        "--load",
        metavar="JSON",
        help="price the measurement an earlier --json run wrote, instead of measuring",
    )
    parser.add_argument(
        "--skip-pipeline", action="store_true", help="measure the agent only (no synth, no harness)"
    )
    args = parser.parse_args(argv)
    nodes = [int(n) for n in args.nodes.split(",")]
    a = Assumptions(
        nodes_per_job=args.nodes_per_job,
        gpus_per_node=args.gpus_per_node,
        health_check_minutes=args.health_check_minutes,
        lambda_seconds=args.lambda_seconds,
        ledger_months=args.ledger_months,
    )
    os.environ.setdefault("AWS_DEFAULT_REGION", PRICES_REGION)
    if args.load:
        # Price an earlier measurement (what --json printed) again, e.g. with other assumptions.
        measured = json.loads(Path(args.load).read_text())["measured"]
    else:
        measured = {
            "run": {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": " ".join(["python", "benchmarks/cost.py", *(argv or sys.argv[1:])]),
                "machine": f"{os.cpu_count()} CPUs, load average "
                + " ".join(f"{x:.1f}" for x in os.getloadavg()),
                "python": sys.version.split()[0],
            },
            "agent": measure_agent(
                ranks_per_job=a.nodes_per_job * a.gpus_per_node, gpus_per_node=a.gpus_per_node
            ),
        }
        if not args.skip_pipeline:
            measured["stack"] = measure_stack(cluster_nodes=args.cluster_nodes)
    if args.liveness_interval:
        measured["agent"]["liveness_interval_s"] = args.liveness_interval
    if args.json:
        costs = {
            str(n): {
                "idle": monthly(
                    measured["agent"], measured.get("stack"), nodes=n, alarms_per_day=0, a=a
                ),
                "one_alarm_a_day": monthly(
                    measured["agent"], measured.get("stack"), nodes=n, alarms_per_day=1, a=a
                ),
            }
            for n in nodes
        }
        text = json.dumps(
            {
                "prices": {"region": PRICES_REGION, "date": PRICES_DATE, **PRICES},
                "assumptions": dataclasses.asdict(a),
                "measured": measured,
                "monthly_usd": costs,
            },
            indent=1,
            default=str,
        )
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    else:
        print(summary(measured, a))
        print()
        print(render(measured, nodes, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
