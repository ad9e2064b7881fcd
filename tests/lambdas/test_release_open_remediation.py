"""Release of a node with a remediation in flight is refused (issue 32: a release between admit
and cordon dropped the guard's hold of a node the remediation then cordoned and kept)."""

from __future__ import annotations

from click.testing import CliRunner
from remediation_factories import CLUSTER, LEDGER, item_state

from sdc_remediation.cli import main
from sdc_remediation.dal import ledger


def _held(instance: str) -> list[str]:
    return [h["instance_id"] for h in ledger.Ledger(LEDGER).held(CLUSTER)]


def test_release_between_admit_and_cordon_is_refused_and_the_hold_stays(cloud, k8s, invoke):
    # Given a node just admitted (its remediation open, not cordoned yet: still schedulable)
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    state = item_state(instance, execution="arn:exec:e1")
    state["admission"] = invoke("admit", state)
    assert state["admission"]["decision"] == "admitted"

    # When an operator releases it
    args = ["--ledger-table", LEDGER, "release", node]
    refused = CliRunner().invoke(main, args)

    # Then it is refused by name, and the guard still holds the node
    assert refused.exit_code == 1 and "NodeInRemediation" in refused.output
    assert _held(instance) == [instance]

    # And when the remediation has cordoned, been rejected (kept cordoned) and the node was
    # uncordoned by hand, the release goes through (fault-free)
    invoke("cordon", state)
    invoke("record", {"transition": "rejected", "state": state})
    assert _held(instance) == [instance]
    with k8s.lock:
        k8s.nodes[node]["spec"]["unschedulable"] = False
    released = CliRunner().invoke(main, args)
    assert released.exit_code == 0, released.output
    assert _held(instance) == []
