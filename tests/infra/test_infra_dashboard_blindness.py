"""The dashboard shows whether the alarms can still see (issue 32): the sweeper's flood watch,
its failures and the backstop's starts, with the flood watch's threshold drawn."""

from __future__ import annotations

import re
from pathlib import Path

from infra.constructs.dashboard import SWEEPER_HEALTH_METRICS
from tests.infra.infra_synth import Synth
from tests.infra.infra_template import flatten, resources

SWEEPER = (
    Path(__file__).resolve().parents[2] / "lambdas" / "sdc_remediation" / "logic" / "sweeper.py"
)


def test_the_dashboard_graphs_what_the_sweeper_puts_when_an_alarm_may_be_blind(
    default_synth: Synth,
) -> None:
    # Given the dashboard body and the metrics the sweeper's code puts
    (dashboard,) = resources(default_synth.template, "AWS::CloudWatch::Dashboard").values()
    body = flatten(dashboard["Properties"]["DashboardBody"])
    put = set(re.findall(r'add_metric\(\s*name="(\w+)"', SWEEPER.read_text()))
    # Then every metric the graph names is one the sweeper really puts (no line that never
    # draws), the flood watch's among them
    assert set(SWEEPER_HEALTH_METRICS) <= put, set(SWEEPER_HEALTH_METRICS) - put
    assert {"series_flood", "flood_watch_failed", "reminder_failed"} <= set(SWEEPER_HEALTH_METRICS)
    # And the graph searches them on this cluster, with the threshold at which the watch tells
    # (the default floodWatchFraction 0.8 of the alarm query's 500 series)
    assert "Alarm blindness" in body
    for name in SWEEPER_HEALTH_METRICS:
        assert f'MetricName=\\"{name}\\"' in body
    assert 'ClusterName=\\"example-hyperpod-cluster\\" (MetricName=' in body
    assert '"value":400' in body and "floodWatchFraction" in body
