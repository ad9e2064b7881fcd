"""The settings the bill depends on, read from the template ``cdk synth`` makes with the
project's own cdk.json context: schedules, the health-check poll interval, the functions' memory
and architecture, the alarms and their metrics, dashboards, KMS keys and log retention.

Read from the template rather than retyped, so the bill follows what would be deployed.
"""

from __future__ import annotations

import json
import re
from typing import Any


def production_settings(template: dict[str, Any]) -> dict[str, Any]:
    """What the cost depends on in the template `cdk synth` makes from cdk.json's context:
    schedules, the poll interval, functions' memory, alarms and their metrics, log retention."""
    from infra.template import function_logical_ids

    resources = template["Resources"]
    logical = {v: k for k, v in function_logical_ids(template).items()}
    memory = {
        logical[k]: r["Properties"].get("MemorySize", 128)
        for k, r in resources.items()
        if k in logical
    }
    arch = {
        r["Properties"].get("Architectures", ["x86_64"])[0]
        for k, r in resources.items()
        if k in logical
    }
    schedules = {}
    for r in resources.values():
        if r["Type"] != "AWS::Scheduler::Schedule":
            continue
        target = r["Properties"]["Target"]["Arn"]
        folder = next((logical[t] for t in logical if t in json.dumps(target)), json.dumps(target))
        schedules[folder] = _rate_seconds(r["Properties"]["ScheduleExpression"])
    alarms = []
    for r in resources.values():
        if r["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = r["Properties"]
        name = props.get("AlarmName", "?")
        if isinstance(name, dict):
            name = json.dumps(name)
        if "Metrics" in props:
            stats = [m for m in props["Metrics"] if "MetricStat" in m]
            insights = [m for m in props["Metrics"] if "SELECT" in m.get("Expression", "")]
            periods = [m["MetricStat"]["Period"] for m in stats] + [
                m.get("Period", 60) for m in insights
            ]
            alarms.append(
                {
                    "name": name,
                    "metrics": len(stats),
                    "insights_query": bool(insights),
                    "period": min(periods),
                }
            )
        else:
            alarms.append(
                {
                    "name": name,
                    "metrics": 1,
                    "insights_query": False,
                    "period": props.get("Period", 60),
                }
            )
    definition = json.dumps(
        next(r for r in resources.values() if r["Type"] == "AWS::StepFunctions::StateMachine")[
            "Properties"
        ]["DefinitionString"]
    )
    poll = re.search(
        r'WaitForHealthCheck\\\\?"\s*:\s*\{\\\\?"Type\\\\?"\s*:\s*\\\\?"Wait\\\\?"\s*,'
        r'\s*\\\\?"Seconds\\\\?"\s*:\s*(\d+)',
        definition,
    )
    retention = {
        r["Properties"].get("RetentionInDays")
        for r in resources.values()
        if r["Type"] == "AWS::Logs::LogGroup"
    }
    return {
        "memory_mb": dict(sorted(memory.items())),
        "architectures": sorted(arch),
        "schedules_s": schedules,
        "alarms": alarms,
        "dashboards": sum(
            1 for r in resources.values() if r["Type"] == "AWS::CloudWatch::Dashboard"
        ),
        "kms_keys": sum(1 for r in resources.values() if r["Type"] == "AWS::KMS::Key"),
        "health_check_poll_s": int(poll.group(1)) if poll else None,
        "log_retention_days": max((d for d in retention if d), default=None),
    }


def _rate_seconds(expression: str) -> int:
    """``rate(15 minutes)`` -> 900."""
    match = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", expression)
    if not match:
        raise ValueError(f"not a rate expression: {expression!r}")
    unit = {"minute": 60, "hour": 3600, "day": 86400}[match.group(2).rstrip("s")]
    return int(match.group(1)) * unit
