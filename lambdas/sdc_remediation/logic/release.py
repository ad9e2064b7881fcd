"""Releasing a node from the blast-radius guard (``sdc-remediation release NODE``): only a node
that is back in service (uncordoned) or gone (replaced) is released.

The guard counts a node sdc-guard cordoned until someone says it is back; releasing a node that
is still cordoned would make the guard count it in service while it is not, and let the next
alarms take more nodes out. So the node is read first (Kubernetes): gone is fine (replaced, or
removed from the cluster), schedulable is fine, still cordoned is ``NodeStillCordoned``.
"""

from __future__ import annotations

from collections.abc import Callable

from sdc_contract.names import NODE_NAME_PREFIX, is_instance_id, node_name_of

from ..clients.kube import KubeApi, node_unschedulable
from ..dal.ledger import Ledger
from ..errors import InvalidStepInput, NodeNotFound, NodeStillCordoned


def release(
    ledger: Ledger,
    kube: Callable[[], KubeApi],
    node: str,
    *,
    released_by: str,
    reason: str = "",
) -> str:
    """Release ``node`` (a node name or an instance id) from the guard as ``released_by``, once
    Kubernetes shows it uncordoned or gone; returns its instance id."""
    instance_id = node.removeprefix(NODE_NAME_PREFIX)
    if not is_instance_id(instance_id):
        raise InvalidStepInput(f"{node!r} is neither a HyperPod node name nor an instance id")
    name = node_name_of(instance_id)
    try:
        found = kube().get_node(name)
    except NodeNotFound:
        found = None  # replaced or removed: nothing of it is in service or out of it
    if found is not None and node_unschedulable(found):
        raise NodeStillCordoned(
            f"{name} is still cordoned: uncordon it (kubectl uncordon {name}) or replace it "
            "first; the guard counts it out of service until then"
        )
    return ledger.release(None, node, released_by=released_by, reason=reason)


__all__ = ["release"]
