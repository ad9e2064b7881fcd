"""The outcome metric the dashboard searches: one EMF line per transition, by cluster, check and
verdict, and none when metrics are disabled (the local chain's quiet mode)."""

from __future__ import annotations

import json

from sdc_contract.metrics import OUTCOME_DIMENSIONS, POWERTOOLS_METRICS_NAMESPACE
from sdc_remediation.logic.recording import outcome_metric


def test_an_outcome_is_one_emf_metric_named_after_the_transition(capsys, monkeypatch):
    # Given the functions' service name, as infra sets it
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "sdc-remediation")
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    # When a cordon of a culprit is recorded
    outcome_metric("ml", "compute", "culprit", "cordoned")
    # Then one EMF line carries the count under the contract's namespace and dimensions
    (line,) = capsys.readouterr().out.splitlines()
    blob = json.loads(line)
    (directive,) = blob["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == POWERTOOLS_METRICS_NAMESPACE
    assert directive["Metrics"] == [{"Name": "cordoned", "Unit": "Count"}]
    assert set(OUTCOME_DIMENSIONS) <= set(directive["Dimensions"][0])
    assert (blob["ClusterName"], blob["Check"], blob["Verdict"]) == ("ml", "compute", "culprit")
    assert blob["cordoned"] == [1.0]


def test_no_emf_line_when_metrics_are_disabled(capsys, monkeypatch):
    # Given metrics disabled (the demo's quiet chain)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    # When an outcome is recorded
    outcome_metric("ml", "compute", "culprit", "replaced")
    # Then nothing is printed
    assert capsys.readouterr().out == ""
