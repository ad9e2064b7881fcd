"""A cordon is ours only in the remediation that set it (issue 32: after `kubectl uncordon` and
`sdc-remediation release` the label stayed; a later cordon by an operator or HyperPod's agent
was then taken for ours, and a reject-with-release made the node schedulable)."""

from __future__ import annotations

from click.testing import CliRunner
from remediation_factories import LEDGER, approved, held_after_rejection, item_state

from sdc_remediation.cli import main


def _reject_and_release(instance: str) -> dict:
    """A person's reject-with-release of the node, in the approvals table."""
    return approved(instance, decision="reject", release=True)


def _admitted(instance: str, remediation_id: str) -> dict:
    admission = {"decision": "admitted", "remediation_id": remediation_id, "reason": "admitted"}
    return item_state(instance, admission=admission)


def _uncordon_by_hand(k8s, node: str) -> None:
    """`kubectl uncordon`: spec only, the labels and annotations stay."""
    with k8s.lock:
        k8s.nodes[node]["spec"]["unschedulable"] = False


def test_release_takes_our_label_and_annotations_off_the_node(cloud, k8s, invoke):
    # Given a node we cordoned in a remediation that was rejected (kept cordoned, held), then
    # uncordoned by hand
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    admission = held_after_rejection(invoke, instance)
    invoke("cordon", item_state(instance, admission=admission))
    _uncordon_by_hand(k8s, node)

    # When an operator releases it
    out = CliRunner().invoke(main, ["--ledger-table", LEDGER, "release", node])

    # Then our label and annotations went with the release, which is annotated
    assert out.exit_code == 0, out.output
    metadata = k8s.nodes[node]["metadata"]
    assert "sdc.guard/suspect" not in metadata["labels"]
    assert not {"sdc.guard/alarm", "sdc.guard/remediation"} & set(metadata["annotations"])
    assert "moto" in metadata["annotations"]["sdc.guard/released"]


def test_a_later_cordon_on_a_node_with_a_stale_label_is_never_lifted(cloud, k8s, invoke):
    # Given remediation r-1 cordoned the node; someone uncordoned it by hand (the label stays),
    # then an operator cordoned it again
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    invoke("cordon", _admitted(instance, "r-1"))
    _uncordon_by_hand(k8s, node)
    with k8s.lock:
        k8s.nodes[node]["spec"]["unschedulable"] = True

    # When a new remediation r-2 cordons it, and a person rejects with release
    cordoned = invoke("cordon", _admitted(instance, "r-2"))
    released = invoke(
        "uncordon", {**_admitted(instance, "r-2"), "approval": _reject_and_release(instance)}
    )

    # Then r-2 recorded the cordon as someone else's, and the node stays cordoned
    assert cordoned["changed"] is True
    assert k8s.patches[1].body["metadata"]["annotations"]["sdc.guard/was-unschedulable"] == "true"
    assert released["cordoned"] is True
    assert k8s.nodes[node]["spec"]["unschedulable"] is True


def test_another_remediations_mark_is_left_alone_by_uncordon(cloud, k8s, invoke):
    # Given remediation r-1 cordoned the node (and still holds it)
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    invoke("cordon", _admitted(instance, "r-1"))

    # When an item of another remediation (r-2) uncordons after a reject-with-release
    out = invoke(
        "uncordon", {**_admitted(instance, "r-2"), "approval": _reject_and_release(instance)}
    )

    # Then nothing is sent: the cordon is r-1's
    assert out == {
        "node_name": node,
        "cordoned": True,
        "changed": False,
        "dry_run": False,
        "health_check_label": None,
    }
    assert len(k8s.patches) == 1 and k8s.nodes[node]["spec"]["unschedulable"] is True


def test_the_remediation_that_cordoned_lifts_its_own_cordon(cloud, k8s, invoke):
    # Given remediation r-1 cordoned a schedulable node (fault-free)
    instance = cloud.nodes[0]
    node = f"hyperpod-{instance}"
    k8s.add_node(node)
    invoke("cordon", _admitted(instance, "r-1"))

    # When r-1's reject-with-release uncordons
    out = invoke(
        "uncordon", {**_admitted(instance, "r-1"), "approval": _reject_and_release(instance)}
    )

    # Then the node is schedulable and every mark is gone
    assert out["changed"] is True and out["cordoned"] is False
    metadata = k8s.nodes[node]["metadata"]
    assert k8s.nodes[node]["spec"]["unschedulable"] is False
    assert "sdc.guard/suspect" not in metadata["labels"]
    assert "sdc.guard/remediation" not in metadata["annotations"]


def test_a_retried_cordon_of_the_same_remediation_sends_nothing(cloud, k8s, invoke):
    # Given r-1 cordoned the node
    instance = cloud.nodes[0]
    k8s.add_node(f"hyperpod-{instance}")
    invoke("cordon", _admitted(instance, "r-1"))

    # When the step is retried
    out = invoke("cordon", _admitted(instance, "r-1"))

    # Then nothing is sent
    assert out["changed"] is False and len(k8s.patches) == 1
