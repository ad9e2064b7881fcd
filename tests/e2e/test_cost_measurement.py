"""benchmarks/cost.py's stack measurement on the end-to-end harness: each phase's calls are
attributed to the functions that made them, and what the harness itself does is kept apart."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("sdc_cost", REPO / "benchmarks" / "cost.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sdc_cost"] = module
    spec.loader.exec_module(module)
    return module


# Three phases on one pipeline, plus the production synth: more than one scenario's time, and a
# busy machine stretches it; generous, since nothing here asserts a duration.
@pytest.mark.timeout(900)
def test_the_stack_measurement_counts_each_phase_by_function():
    cost = _load()
    stack = cost.measure_stack(cluster_nodes=3)

    alarm, sweep, canary = stack["alarm"], stack["sweep"], stack["canary"]
    # The alarm went the whole way: localize read the metrics, record wrote the ledger and
    # notified, the operator's approval reached the approve function
    assert alarm["executions"] == 1
    assert alarm["states"]["PollHealthCheck"] >= 2
    assert stack["poll_loop_transitions"] >= 2
    localize = alarm["functions"]["localize"]["calls"]["operations"]
    assert localize["cloudwatch:GetMetricData"] >= 1
    assert alarm["functions"]["record"]["calls"]["sns_publishes"] >= 1
    assert alarm["functions"]["approve"]["invocations"] == 1
    assert alarm["ddb_wru"] > 0 and alarm["ledger_kept_added"] > 0
    assert alarm["emf_series"] and alarm["lambda_log_bytes"] > 0 and alarm["state_log_bytes"] > 0
    # ... and the harness's own calls (starting the execution, polling it) are not the stack's
    assert "stepfunctions:StartExecution" in alarm["harness_operations"]
    assert "stepfunctions:StartExecution" not in alarm["operations"]
    # The sweeper scans the ledger (billed on the table's size) and starts no execution
    assert sweep["executions"] == 0 and sweep["scans"] >= 1 and sweep["scan_rru"] >= 1
    # The canary's run put its synthetic finding and went through the workflow
    assert canary["executions"] == 1
    # (the canary puts its datum in its own namespace, apart from the pods: issue 32)
    assert any(s.startswith("SDC/Canary:") for s in canary["put_metric_data_series"])
    # The production settings come from the template
    production = stack["production"]
    assert production["schedules_s"]["sweeper"] > 0 and production["health_check_poll_s"] > 1
