"""The report group is the stack's (issue 33): the canary writes into it and never creates it
(its role has no logs:CreateLogGroup), so a missing group is a clear configuration error, not a
group made without the stack's retention and key."""

from __future__ import annotations

import time

import pytest
from moto import mock_aws

from sdc_remediation.clients import logs
from sdc_remediation.errors import ConfigurationError


def test_the_canary_writes_into_the_stacks_group_and_creates_its_stream() -> None:
    with mock_aws():
        # Given the group the stack created
        from sdc_remediation import aws

        client = aws.client("logs")
        client.create_log_group(logGroupName="/sdc/hp-test")
        # When the canary writes its report twice
        now_ms = int(time.time() * 1000)
        logs.put_event("/sdc/hp-test", "sdc-canary", '{"schema": "sdc.alarm/v1"}', now_ms)
        logs.put_event("/sdc/hp-test", "sdc-canary", '{"schema": "sdc.alarm/v1"}', now_ms + 1)
        # Then both events are in its stream
        events = client.get_log_events(logGroupName="/sdc/hp-test", logStreamName="sdc-canary")
        assert len(events["events"]) == 2


def test_a_missing_report_group_is_a_configuration_error_and_is_not_created() -> None:
    with mock_aws():
        # Given no report group (an adopted one that was deleted)
        from sdc_remediation import aws

        # When the canary writes its report / Then it says what is wrong and creates nothing
        with pytest.raises(ConfigurationError, match="does not exist: the stack creates it"):
            logs.put_event("/sdc/hp-test", "sdc-canary", "{}", 1_000)
        assert aws.client("logs").describe_log_groups()["logGroups"] == []
