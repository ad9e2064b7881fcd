"""Releasing a node from the blast-radius guard (``sdc-remediation release NODE``): only a node
that is back in service (uncordoned) or gone (replaced) is released.

The guard counts a node sdc-guard cordoned until someone says it is back; releasing a node that
is still cordoned would make the guard count it in service while it is not, and let the next
alarms take more nodes out. So the node is read first (Kubernetes): gone is fine (replaced, or
removed from the cluster), schedulable is fine, still cordoned is ``NodeStillCordoned``.

Once released, sdc-guard's label and annotations leave the node too: a mark that outlived the
cordon (``kubectl uncordon`` by hand) would say "suspect" of a node in service. Whose cordon a
node carries is never read from the label alone (``cordon.ours`` compares the remediation id),
so a mark that could not be removed is stale text, never a cordon a later remediation lifts.
"""

from __future__ import annotations

from collections.abc import Callable

from sdc_contract.names import NODE_NAME_PREFIX, is_instance_id, node_name_of

from .. import clock
from ..clients.kube import KubeApi, node_labels, node_unschedulable
from ..dal.ledger import Ledger
from ..errors import (
    ClusterApiUnavailable,
    ConfigurationError,
    InvalidStepInput,
    NodeNotFound,
    NodeStillCordoned,
)
from ..observability import logger
from .cordon import RELEASED_ANNOTATION, SUSPECT_LABEL, mark_removal


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
    api = kube()
    try:
        found = api.get_node(name)
    except NodeNotFound:
        found = None  # replaced or removed: nothing of it is in service or out of it
    if found is not None and node_unschedulable(found):
        raise NodeStillCordoned(
            f"{name} is still cordoned: uncordon it (kubectl uncordon {name}) or replace it "
            "first; the guard counts it out of service until then"
        )
    released = ledger.release(None, node, released_by=released_by, reason=reason)
    if found is not None and node_labels(found).get(SUSPECT_LABEL) is not None:
        _remove_mark(api, name, released_by)
    return released


def _remove_mark(api: KubeApi, name: str, released_by: str) -> None:
    """Take sdc-guard's label and annotations off a released (schedulable) node. The release
    itself is done (the ledger's): a failure here is logged, not raised, since the mark left
    behind is inert (see the module's docstring) and repeating the release would answer
    ``NodeNotHeld``."""
    metadata = mark_removal()
    metadata["annotations"][RELEASED_ANNOTATION] = f"{clock.iso(clock.now())} by {released_by}"
    try:
        api.patch_node(name, {"metadata": metadata})
    except (ClusterApiUnavailable, ConfigurationError, NodeNotFound, InvalidStepInput) as exc:
        logger.warning(
            "released, but sdc-guard's label could not be removed from the node",
            extra={"node": name, "error": str(exc)[:300]},
        )


__all__ = ["release"]
