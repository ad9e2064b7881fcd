"""How each AWS service meters what it is sent: pure functions from a request, a response, an
execution history or a printed log line to the units the service bills.

Kept apart from the hooks that see the calls (:mod:`.counting`) and from the arithmetic that
prices a month (:mod:`.monthly`): the sizing rules are the part to check against the services'
documentation, and they are tested on their own with figures worked out by hand.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any

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
