"""The live canary on the local pipeline: start a run as its schedule would, and evaluate its
not-completed alarm as CloudWatch would once the alarm's window ended, with both its actions.

What is ours runs for real: the canary function (start and check), the canary's SDC alarm (the
evaluator of ``alarms.py`` evaluates it like every SDC alarm and delivers it through the rule),
the workflow, and the not-completed alarm's properties from the template (metric, threshold,
missing data treated as breaching, its two actions). What stands in: EventBridge Scheduler (a
call to :meth:`start`), and the alarm's period (a test cannot wait a day: :meth:`evaluate` looks
at the datapoints since the run started, as CloudWatch would at the end of the window). The SNS
message CloudWatch sends has the documented keys a person reads (AlarmName, NewStateValue,
NewStateReason, AlarmDescription); the Lambda action's event has the documented shape
(``source``, ``alarmArn``, ``alarmData``).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

from infra.template import function_logical_ids

from .account import ACCOUNT, REGION
from .pipeline import LocalPipeline

START = {"action": "start"}
NOT_COMPLETED_SUFFIX = "-canary-not-completed"


@dataclass
class CanaryRun:
    """A started run: its id and when it started."""

    run_id: str
    started: datetime.datetime


@dataclass
class LocalCanary:
    """The canary's schedule and its not-completed alarm, for one :class:`LocalPipeline`."""

    pipeline: LocalPipeline

    def start(self) -> CanaryRun:
        """What the schedule does: invoke the canary function with its input."""
        started = datetime.datetime.now(datetime.UTC)
        out = self.pipeline.invoke("canary", START)
        return CanaryRun(run_id=out["run"], started=started)

    def _alarm(self) -> tuple[str, dict[str, Any]]:
        for logical_id, res in self.pipeline.template["Resources"].items():
            props = res.get("Properties", {})
            if res["Type"] == "AWS::CloudWatch::Alarm" and str(props.get("AlarmName", "")).endswith(
                NOT_COMPLETED_SUFFIX
            ):
                return logical_id, props
        raise LookupError("the template has no canary not-completed alarm (canarySchedule off?)")

    def completed_since(self, since: datetime.datetime) -> float:
        """The alarm's statistic over the datapoints since ``since`` (0: none, missing)."""
        _, props = self._alarm()
        result = self.pipeline.client("cloudwatch").get_metric_data(
            MetricDataQueries=[
                {
                    "Id": "m",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": props["Namespace"],
                            "MetricName": props["MetricName"],
                            "Dimensions": self.pipeline.resolve(props["Dimensions"]),
                        },
                        "Period": 60,
                        "Stat": props["Statistic"],
                    },
                }
            ],
            StartTime=since - datetime.timedelta(minutes=1),
            EndTime=datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1),
        )
        return float(sum(result["MetricDataResults"][0]["Values"]))

    def evaluate(self, since: datetime.datetime) -> dict[str, Any] | None:
        """Evaluate the not-completed alarm at the end of a window that began at ``since``;
        when it fires, run its actions (SNS, then the canary function) and return the function's
        answer (None: the alarm stayed OK)."""
        _, props = self._alarm()
        assert props["TreatMissingData"] == "breaching"
        assert props["ComparisonOperator"] == "LessThanThreshold"
        value = self.completed_since(since)
        if value >= float(props["Threshold"]):
            return None
        name = props["AlarmName"]
        reason = (
            f"Threshold Crossed: no datapoints were received for 1 period and 1 missing "
            f"datapoint was treated as [Breaching] (sum {value} < {props['Threshold']})"
        )
        cloudwatch = self.pipeline.client("cloudwatch")
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace=props["Namespace"],
            MetricName=props["MetricName"],
            Dimensions=self.pipeline.resolve(props["Dimensions"]),
            Period=int(props["Period"]),
            Statistic=props["Statistic"],
            Threshold=float(props["Threshold"]),
            ComparisonOperator=props["ComparisonOperator"],
            EvaluationPeriods=int(props["EvaluationPeriods"]),
            TreatMissingData=props["TreatMissingData"],
        )
        cloudwatch.set_alarm_state(AlarmName=name, StateValue="ALARM", StateReason=reason)
        folders = {
            lid: folder for folder, lid in function_logical_ids(self.pipeline.template).items()
        }
        answer = None
        for action in props["AlarmActions"]:
            target = action.get("Fn::GetAtt", [None])[0] if isinstance(action, dict) else None
            if target in folders:  # a Lambda action: the function, invoked with the alarm
                answer = self.pipeline.invoke(folders[target], self._action_event(name, reason))
                continue
            self.pipeline.client("sns").publish(
                TopicArn=self.pipeline.resolve(action),
                Subject=f'ALARM: "{name}" in US East (N. Virginia)'[:100],
                Message=json.dumps(
                    {
                        "AlarmName": name,
                        "AlarmDescription": props.get("AlarmDescription"),
                        "NewStateValue": "ALARM",
                        "NewStateReason": reason,
                    }
                ),
            )
        return answer

    @staticmethod
    def _action_event(name: str, reason: str) -> dict[str, Any]:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
        return {
            "source": "aws.cloudwatch",
            "alarmArn": f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{name}",
            "accountId": ACCOUNT,
            "time": stamp,
            "region": REGION,
            "alarmData": {
                "alarmName": name,
                "state": {"value": "ALARM", "reason": reason, "timestamp": stamp},
                "previousState": {"value": "OK", "reason": "", "timestamp": stamp},
            },
        }
