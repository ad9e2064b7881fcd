"""The remediation stack, measured on the end-to-end harness (tests/e2e/harness): one alarm
taken from the agent's publish to a replaced node, one sweeper run, one canary run.

The drivers of those three scenarios, and what each phase amounted to: the calls each function
made (attributed by its invocation thread), its invocations and their durations, the state
transitions and state-machine log bytes of the executions it started, the functions' logs and
Powertools EMF lines, DynamoDB units and the ledger's growth.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .counting import CallCounter, diff, item_key, register_table_keys
from .metering import (
    LOG_EVENT_OVERHEAD,
    dynamo_item_size,
    emf_series,
    read_units,
    state_log_bytes,
    transitions_of,
    write_units,
)
from .production import production_settings


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
                sizes[(table, item_key(table, item))] = dynamo_item_size(item)
    return sizes


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
