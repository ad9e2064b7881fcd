"""The shadow guard: which shadowed alarms may run a deep health check on an uncordoned node.

``shadowHealthCheck`` runs the deep health check of a shadowed alarm on the node as it is (not
cordoned), which disrupts what runs there. The enforced guard's budget is not used for it (a
noisy check in shadow must never keep a real finding from being admitted), so the shadow checks
have a guard of their own, a fraction of the cluster like the enforced one: at most
``max(1, floor(MAX_FRACTION x nodes))`` shadow checks at once, and none for an alarm that names
more nodes than that (a storm).

One item per cluster, ``keys.shadow_guard`` (``pk=GUARD#<cluster>, sk=SHADOW``): ``version``
and ``running`` (``{instance_id, execution, item, at}``: a slot is one Map item's, by execution,
item index and node, since the two Maps' indexes overlap), rewritten under its version. The
record step frees a slot when it records the shadow; a slot older than ``SLOT_SECONDS`` counts
no more (an execution that ended without its record).
"""

from __future__ import annotations

from typing import Any

from .. import clock
from ..errors import AwsApiUnavailable
from ..models.admission import AdmitRequest
from . import keys
from .dynamo import RACE_ATTEMPTS, Table, at_version

SLOT_SECONDS = 4 * 3600
"""A slot older than this no longer counts (longer than a health check's timeout, 150 min by
default, plus its polls)."""


def _read(table: Table, cluster: str) -> dict[str, Any]:
    return table.get(keys.shadow_guard(cluster)) or {"version": 0, "running": []}


def _write(table: Table, cluster: str, version: int, running: list[dict[str, Any]]) -> bool:
    """Rewrite the slots under ``version``; False when another writer changed them first."""
    item = {**keys.shadow_guard(cluster), "version": version + 1, "running": running}
    return table.put_if(item, **at_version(version))


def _current(running: list[dict[str, Any]], now: int) -> list[dict[str, Any]]:
    return [r for r in running if now - int(r["at"]) < SLOT_SECONDS]


def _same(slot: dict[str, Any], req: AdmitRequest) -> bool:
    """Whether ``slot`` is this request's own (a retried admit): the same execution, Map item
    index AND node. The index alone is not an item's identity: the suspects' Map and the late
    nodes' Map both count from 0, so a suspect and a late node of one alarm share it, and the
    late node once took the suspect's slot as its own (three checks ran, the limit was two)."""
    return (
        slot.get("execution") == req.execution
        and slot.get("item") == req.item
        and slot.get("instance_id") == req.instance_id
    )


def admit(table: str, req: AdmitRequest, limit: int) -> tuple[bool, str]:
    """Whether the shadowed alarm of ``req`` may run its deep health check now, and why: at
    most ``limit`` at once (the guard's fraction of the cluster, ``admission.max_open``)."""
    if req.suspects_in_alarm > limit:
        return False, (
            f"not run: the alarm names {req.suspects_in_alarm} nodes, more than the shadow "
            f"checks' fraction of the cluster allows ({limit})"
        )
    store = Table(table)
    for _ in range(RACE_ATTEMPTS):
        now = int(clock.now().timestamp())
        guard = _read(store, req.cluster)
        running = _current(list(guard.get("running") or []), now)
        if any(_same(r, req) for r in running):
            return True, "run (its slot of the shadow guard)"  # a retried admit
        if any(r["instance_id"] == req.instance_id for r in running):
            return False, "not run: a shadow check already runs on this node"
        if len(running) >= limit:
            return False, (
                f"not run: {len(running)} shadow check(s) already run, the shadow guard's "
                f"limit (a fraction of the cluster: {limit})"
            )
        slot = {"instance_id": req.instance_id, "execution": req.execution, "at": now}
        if req.item is not None:
            slot["item"] = req.item
        if _write(store, req.cluster, int(guard.get("version", 0)), [*running, slot]):
            return True, f"run ({len(running) + 1} of at most {limit} shadow checks at once)"
    raise AwsApiUnavailable(f"the shadow guard of {req.cluster} lost {RACE_ATTEMPTS} races; retry")


def release(table: str, cluster: str, instance_id: str, execution: str, item: int | None) -> None:
    """Free the slot this execution's item holds on ``instance_id`` (nothing if none)."""
    store = Table(table)
    for _ in range(RACE_ATTEMPTS):
        guard = _read(store, cluster)
        running = list(guard.get("running") or [])
        kept = [
            r
            for r in running
            if not (
                r["instance_id"] == instance_id
                and r.get("execution") == execution
                and (item is None or r.get("item") in (None, item))
            )
        ]
        if len(kept) == len(running):
            return
        if _write(store, cluster, int(guard.get("version", 0)), kept):
            return
    raise AwsApiUnavailable(f"freeing a shadow check slot of {cluster} lost {RACE_ATTEMPTS} races")


__all__ = ["SLOT_SECONDS", "admit", "release"]
