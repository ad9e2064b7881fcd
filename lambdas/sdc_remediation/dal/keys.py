"""Every key of the tables, built here and nowhere else (docs/CONTRACT.md, "DynamoDB tables").

The ledger is one table of many kinds of item, told apart by their keys:

- ``pk=<instance id>, sk=STATE``: the node's current remediation (``state``).
- ``pk=<instance id>, sk=EVENT#<iso time>#<remediation id>#<n>``: one per transition
  (``event``); a transition that concerns no single node is under ``pk=CLUSTER#<cluster>``
  (``cluster_pk``).
- ``pk=<instance id>, sk=REPORT#<report>``: the remediation a report raised on the node
  (``report``).
- ``pk=GUARD#<cluster>``: the blast-radius guard (``sk=GUARD``, ``guard``) and the shadow
  checks' guard (``sk=SHADOW``, ``shadow_guard``).
- ``pk=CLUSTER#<cluster>, sk=NOTICE#<episode>#<transition>`` (``notice``) and
  ``sk=DUE#<what>`` (``due``): one message per alarm episode, one reminder per period.
- ``pk=CANARY#<cluster>, sk=RUN#<run id>``: the canary's runs (``run``; the partition is the
  contract's, which infra's LeadingKeys grants name too).
- ``pk=SCREEN#<cluster>, sk=<node name>``: the idle screener's last and running screen of a
  node (``screen``).
- ``pk=REFUSED#<cluster>, sk=REPORT#<report>``: a report the admission refused (the guard's
  circuit open), whatever node (``report_refusal``; expires).
- ``pk=BACKSTOP#<cluster>``: the sweeper's backstop: ``sk=REPORT#<report>``, a report it
  started the workflow for (``backstop_start``; expires), and ``sk=CURSOR``, where its reading
  of the report group stands (``backstop_cursor``).

The approvals table has one kind of item, keyed by ``approval_id`` (``approval``).

A whole key is a dict of plain values (``dynamo.Table`` serialises it); an item is its key and
its attributes: ``{**keys.state(instance_id), "open": True, ...}``. Tests seed and read the
tables through these functions too, so a key changes in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdc_contract.canary import canary_runs_key
from sdc_contract.idle_screen import screens_key

STATE_SK = "STATE"
GUARD_SK = "GUARD"
SHADOW_SK = "SHADOW"
GUARD_PREFIX = "GUARD#"
CLUSTER_PREFIX = "CLUSTER#"
EVENT_PREFIX = "EVENT#"
REPORT_PREFIX = "REPORT#"
NOTICE_PREFIX = "NOTICE#"
DUE_PREFIX = "DUE#"
RUN_PREFIX = "RUN#"
REFUSED_PREFIX = "REFUSED#"
BACKSTOP_PREFIX = "BACKSTOP#"
CURSOR_SK = "CURSOR"
_MAX_SK = 1024
"""DynamoDB's limit on a sort key (bytes); keys built from free text are cut to it."""

Key = dict[str, Any]


# -- partition and sort keys ------------------------------------------------------------------


def guard_pk(cluster: str) -> str:
    """Partition key of a cluster's guard items (the enforced one and the shadow one)."""
    return f"{GUARD_PREFIX}{cluster}"


def cluster_pk(cluster: str) -> str:
    """Partition key for transitions (and notices) that concern no single node."""
    return f"{CLUSTER_PREFIX}{cluster}"


def run_pk(cluster: str) -> str:
    """Partition key of a cluster's canary runs."""
    return canary_runs_key(cluster)


def report_sk(report: str) -> str:
    """Sort key of the item that says which remediation a report raised on a node."""
    return f"{REPORT_PREFIX}{report}"[:_MAX_SK]


def event_sk(at: str, remediation_id: str, n: int = 0) -> str:
    """Sort key of a transition recorded at ``at`` (ISO time: events sort by time), the
    ``n``-th try of that moment (two transitions in one clock tick)."""
    return f"{EVENT_PREFIX}{at}#{remediation_id}#{n}"


def event_time(sk: str) -> str:
    """The ISO time an event's sort key was built with (``event_sk``)."""
    return sk.split("#", 2)[1]


def run_sk(run_id: str) -> str:
    """Sort key of a canary run."""
    return f"{RUN_PREFIX}{run_id}"


# -- whole keys -------------------------------------------------------------------------------


def state(instance_id: str) -> Key:
    """The node's STATE item."""
    return {"pk": instance_id, "sk": STATE_SK}


def guard(cluster: str) -> Key:
    """The cluster's blast-radius guard item."""
    return {"pk": guard_pk(cluster), "sk": GUARD_SK}


def shadow_guard(cluster: str) -> Key:
    """The cluster's shadow checks' guard item."""
    return {"pk": guard_pk(cluster), "sk": SHADOW_SK}


def report(instance_id: str, report: str) -> Key:
    """The item that says which remediation ``report`` raised on the node."""
    return {"pk": instance_id, "sk": report_sk(report)}


def event(pk: str, at: str, remediation_id: str, n: int = 0) -> Key:
    """A transition under ``pk`` (an instance id, or ``cluster_pk``)."""
    return {"pk": pk, "sk": event_sk(at, remediation_id, n)}


def notice(cluster: str, episode: str, transition: str) -> Key:
    """The item that says when ``transition`` of alarm ``episode`` was last notified."""
    return {"pk": cluster_pk(cluster), "sk": f"{NOTICE_PREFIX}{episode}#{transition}"[:_MAX_SK]}


def due(cluster: str, what: str) -> Key:
    """The item that says when the periodic ``what`` (a reminder) is next due."""
    return {"pk": cluster_pk(cluster), "sk": f"{DUE_PREFIX}{what}"}


def run(cluster: str, run_id: str) -> Key:
    """A canary run of the cluster."""
    return {"pk": run_pk(cluster), "sk": run_sk(run_id)}


def screen(cluster: str, node_name: str) -> Key:
    """A node's idle screens (``sdc_contract.idle_screen.screens_key``, sort key its name)."""
    return {"pk": screens_key(cluster), "sk": node_name}


def report_refusal(cluster: str, report: str) -> Key:
    """The item that says the admission refused ``report`` (any node of it)."""
    return {"pk": f"{REFUSED_PREFIX}{cluster}", "sk": report_sk(report)}


def backstop_start(cluster: str, report: str) -> Key:
    """The item that says the sweeper's backstop started the workflow for ``report``."""
    return {"pk": f"{BACKSTOP_PREFIX}{cluster}", "sk": report_sk(report)}


def backstop_cursor(cluster: str) -> Key:
    """Where the sweeper's backstop stands in the cluster's report group."""
    return {"pk": f"{BACKSTOP_PREFIX}{cluster}", "sk": CURSOR_SK}


def approval(approval_id: str) -> Key:
    """An approval request (the approvals table)."""
    return {"approval_id": approval_id}


# -- reading keys back ------------------------------------------------------------------------


def is_event(item: Mapping[str, Any]) -> bool:
    """Whether a ledger item is a transition (``event``)."""
    return str(item.get("sk", "")).startswith(EVENT_PREFIX)


def is_state(item: Mapping[str, Any]) -> bool:
    """Whether a ledger item is a node's STATE (``state``)."""
    return item.get("sk") == STATE_SK


def is_guard(item: Mapping[str, Any]) -> bool:
    """Whether a ledger item is one of a cluster's guards (``guard``, ``shadow_guard``)."""
    return str(item.get("pk", "")).startswith(GUARD_PREFIX)


__all__ = [
    "BACKSTOP_PREFIX",
    "CLUSTER_PREFIX",
    "CURSOR_SK",
    "DUE_PREFIX",
    "EVENT_PREFIX",
    "GUARD_PREFIX",
    "GUARD_SK",
    "NOTICE_PREFIX",
    "REFUSED_PREFIX",
    "REPORT_PREFIX",
    "RUN_PREFIX",
    "SHADOW_SK",
    "STATE_SK",
    "Key",
    "approval",
    "backstop_cursor",
    "backstop_start",
    "cluster_pk",
    "due",
    "event",
    "event_sk",
    "event_time",
    "guard",
    "guard_pk",
    "is_event",
    "is_guard",
    "is_state",
    "notice",
    "report",
    "report_refusal",
    "report_sk",
    "run",
    "run_pk",
    "run_sk",
    "screen",
    "shadow_guard",
    "state",
]
