"""infra/k8s: the RBAC of each sdc-guard group and the admission policy limiting what the
writers may change on a node (parsed as kubectl would read it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from infra.constructs.eks_access import STEP_GROUPS

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")) if d]


def _by_kind(name: str, kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _docs(name) if d["kind"] == kind}


def _rules(role: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        for resource in rule["resources"]:
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_every_group_an_access_entry_uses_is_bound_to_its_own_role() -> None:
    # Given the RBAC files (the idle screener's is its own: applied only where it is on)
    files = ("rbac.yaml", "idle-screen-rbac.yaml")
    roles = {k: v for f in files for k, v in _by_kind(f, "ClusterRole").items()}
    bindings = {k: v for f in files for k, v in _by_kind(f, "ClusterRoleBinding").items()}

    # Then each group of the access entries is bound to the role of the same name, and no
    # other subject is
    for group in set(STEP_GROUPS.values()):
        binding = bindings[group]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": group,
        }
        assert binding["subjects"] == [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
        ]
        assert group in roles


def test_the_reader_only_reads_and_the_writers_only_get_and_patch_nodes() -> None:
    roles = _by_kind("rbac.yaml", "ClusterRole")
    # Cluster-wide, the reader reads nodes only; no role reads pods of every namespace
    assert _rules(roles["sdc-reader"]) == {"nodes": {"get", "list"}}
    assert _rules(roles["sdc-cordoner"]) == {"nodes": {"get", "patch"}}
    assert _rules(roles["sdc-replacer"]) == {"nodes": {"get", "patch"}}
    assert _rules(roles["sdc-releaser"]) == {"nodes": {"get", "patch"}}
    # No role reaches a subresource (nodes/status) or anything but nodes and pods
    assert all(
        "/" not in r for role in roles.values() for rule in role["rules"] for r in rule["resources"]
    )


def test_the_reader_gets_and_lists_pods_in_the_training_namespace_only() -> None:
    # Given the namespaced Role and its binding (placed by `kubectl apply -n <namespace>`)
    (role,) = _by_kind("rbac.yaml", "Role").values()
    (binding,) = _by_kind("rbac.yaml", "RoleBinding").values()
    # Then the reader may get and list pods there (localize corroborates a report by the job's
    # pods on a node), nothing else, and the objects carry no namespace of their own
    assert _rules(role) == {"pods": {"get", "list"}}
    assert "namespace" not in role["metadata"] and "namespace" not in binding["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "sdc-reader"}
    ]


def test_the_admission_policy_limits_the_writers_on_every_node_update() -> None:
    # Given the policy and its binding
    [policy] = _by_kind("admission-policy.yaml", "ValidatingAdmissionPolicy").values()
    [binding] = _by_kind("admission-policy.yaml", "ValidatingAdmissionPolicyBinding").values()
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]

    # Then it applies to every node UPDATE (a PATCH is one) by the two writer groups, denies,
    # and fails closed
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    [condition] = spec["matchConditions"]
    assert "'sdc-cordoner'" in condition["expression"]
    assert "'sdc-replacer'" in condition["expression"]
    assert "'sdc-releaser'" in condition["expression"]  # sdc.guard/* metadata only
    assert "sdc-reader" not in condition["expression"]
    assert spec["failurePolicy"] == "Fail"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }

    # And every validation compares the new object with the old one; the HyperPod replacement
    # label is allowed only to the replacer, spec.unschedulable only to the cordoner
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    validations = [v["expression"] for v in spec["validations"]]
    assert all("oldObject" in e or "variables.old" in e for e in validations)
    assert variables["healthLabel"] == f"'{HEALTH_LABEL}'"
    labels = next(e for e in validations if "variables.newLabels" in e)
    assert labels.count("variables.replacer && k == variables.healthLabel") == 2
    unschedulable = next(e for e in validations if "unschedulable" in e)
    assert unschedulable.startswith("variables.cordoner ||")
    assert any(e == "variables.newTaints == variables.oldTaints" for e in validations)


def test_the_screener_reads_nodes_and_handles_jobs_in_the_screening_namespace_only() -> None:
    # Given the screener's cluster role (rbac.yaml) and its namespaced role (screen-rbac.yaml)
    roles = _by_kind("rbac.yaml", "ClusterRole")
    (role,) = _by_kind("screen-rbac.yaml", "Role").values()
    (binding,) = _by_kind("screen-rbac.yaml", "RoleBinding").values()

    # Then cluster-wide it only gets nodes (is the suspect cordoned, how many GPUs)
    assert STEP_GROUPS["screen"] == "sdc-screener"
    assert _rules(roles["sdc-screener"]) == {"nodes": {"get"}}
    # and in the namespace `kubectl apply -n` places it in: create/get/delete Jobs, get/list
    # pods, nothing else (no patch, no other resource, no subresource)
    rules = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {("batch", "jobs"): {"create", "get", "delete"}, ("", "pods"): {"get", "list"}}
    assert "namespace" not in role["metadata"] and "namespace" not in binding["metadata"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "sdc-screener"}
    ]
    # and the admission policy (node writers) does not name it: it writes no node
    [policy] = _by_kind("admission-policy.yaml", "ValidatingAdmissionPolicy").values()
    assert "sdc-screener" not in json.dumps(policy)
