"""guard.coverage()'s description, from the schedule and the group alone (no processes)."""

from __future__ import annotations

import json

from sdc_agent import Schedule
from sdc_agent.coverage import describe


def test_a_default_kernel_audit_says_it_compares_losses_only_and_json_round_trips():
    # Given loss-only audits every 3 steps, 2 micro-batches, 3 replicas, no scaler
    cov = describe(
        Schedule(audit_every=3, deterministic_audits=False, peer_offset=1, grad_accum=2),
        global_ranks=[10, 11, 12],
        can_confirm=True,
        scaler=None,
        param_dtypes=["float32", "float32"],
    )
    # Then it is JSON as it is, and says what is compared and which positions are audited
    assert json.loads(json.dumps(cov)) == cov
    audit = cov["checks"]["replay_audit"]
    assert audit["compares"].startswith("loss bits only")
    assert audit["pairs"][0] == {"replayer": 10, "target": 11, "third": 12}
    assert audit["micro_batches"]["positions_of_first_audits"] == [0, 1]
    assert "reproducible" in cov["precision"]["non_finite"]
    assert cov["precision"]["parameter_dtypes"] == ["float32"]


def test_weights_of_two_replicas_are_compared_without_naming_anyone():
    cov = describe(
        Schedule(audit_every=0, check_every=0, check_on_start=False),
        global_ranks=[0, 1],
        can_confirm=False,
        scaler=None,
        param_dtypes=["bfloat16"],
    )
    weights = cov["checks"]["weight_fingerprints"]
    assert not weights["on"] and "check_every is 0" in weights["why"]
    assert "nobody is named" in weights["attribution"]
    confirmation = cov["checks"]["nonfinite_gradients"]["confirmation"]
    assert not confirmation["on"] and "no third GPU" in confirmation["why"]


def test_steps_between_audits_are_blind_only_without_sensors():
    # Given the same job described without and with online sensors
    def between_audits(sensors_on: bool) -> list[str]:
        cov = describe(
            Schedule(audit_every=5),
            global_ranks=[0, 1, 2],
            can_confirm=True,
            scaler=None,
            param_dtypes=["float32"],
            sensors_on=sensors_on,
        )
        return [line for line in cov["not_covered"] if line.startswith("steps between audits")]

    # Then without sensors those steps are blind but for non-finite gradients and weight checks
    (without,) = between_audits(False)
    assert "caught only if it makes a gradient non-finite" in without
    assert "sensors" not in without
    # And with sensors only what they do not sample at that step is left blind
    (with_sensors,) = between_audits(True)
    assert "outside what the online sensors sample" in with_sensors
