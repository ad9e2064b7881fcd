"""Counting AWS calls by caller: a botocore hook on every client, and what it saw per label.

The measurement's one instrument. Both the agent's publisher and the stack's Lambda handlers
are measured by attaching it to their clients; a call is counted under the label its thread
holds, so the harness's own calls (the alarm evaluator, the test's polling) stay apart from the
functions' and are not priced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from .metering import LOG_EVENT_OVERHEAD, dynamo_item_size, read_units, series_key


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
        return [(params["TableName"], item_key(params["TableName"], params["Item"]), False)]
    if op in ("UpdateItem", "DeleteItem"):
        return [(params["TableName"], key(params["Key"]), False)]
    if op == "TransactWriteItems":
        out = []
        for item in params.get("TransactItems", []):
            ((kind, body),) = item.items()
            if kind == "Put":
                out.append((body["TableName"], item_key(body["TableName"], body["Item"]), True))
            else:  # Update, Delete, ConditionCheck (a check is billed as a write)
                out.append((body["TableName"], key(body["Key"]), True))
        return out
    if op == "BatchWriteItem":
        out = []
        for table, requests in params.get("RequestItems", {}).items():
            for request in requests:
                ((kind, body),) = request.items()
                item = body.get("Item") or body.get("Key")
                out.append((table, item_key(table, item), False))
        return out
    return []


_KEY_NAMES: dict[str, tuple[str, ...]] = {}
"""Table -> its key attribute names (filled by :func:`register_table_keys`)."""


def register_table_keys(table: str, names: tuple[str, ...]) -> None:
    """Tell the counter which attributes of ``table``'s items are its key."""
    _KEY_NAMES[table] = names


def item_key(table: str, item: dict[str, Any]) -> str:
    """``item``'s key in ``table`` as a JSON string (the attributes
    :func:`register_table_keys` named, else ``pk`` and ``sk``)."""
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
