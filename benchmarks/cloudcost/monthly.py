"""The arithmetic: from the measured counts and the stated assumptions to billable units a month
(:class:`Usage`), and from those to dollars per service at the list prices.

Pure, so a saved measurement can be priced again under other assumptions (``--load``) without
measuring, and the figures can be checked by hand on a tiny case.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .metering import read_units
from .prices import DAYS_PER_MONTH, HOURS_PER_MONTH, PRICES


@dataclasses.dataclass(frozen=True, kw_only=True)
class Assumptions:
    """What the measurements cannot say about a real cluster (docs/cost.md names each)."""

    nodes_per_job: int = 64
    """Nodes of one training job: the agent publishes per job (its DP rank 0), not per node."""
    gpus_per_node: int = 8
    """Ranks per node (the rank map's size)."""
    job_starts_per_day: float = 1.0
    """Each (re)start of a job publishes its rank map once."""
    health_check_minutes: float = 120.0
    """How long a real deep health check runs (polled at the template's interval)."""
    email_subscribers: int = 1
    """Email endpoints subscribed to the topic."""
    ledger_months: float = 12.0
    """Months of history in the ledger when the bill is read: the sweeper scans the whole
    ledger every run, and remediation events stay in it (only canary runs and approvals
    expire)."""
    lambda_seconds: float = 1.0
    """Billed seconds per invocation at least: the harness runs handlers in-process against
    local stand-ins (milliseconds); in AWS each call to a service takes tens of ms and a cold
    start's init is billed too. The measured time is used when it is longer."""

    def __post_init__(self) -> None:
        for name in ("nodes_per_job", "gpus_per_node", "email_subscribers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"Assumptions.{name} must be an integer >= 1")
        for name in (
            "job_starts_per_day",
            "health_check_minutes",
            "lambda_seconds",
            "ledger_months",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Assumptions.{name} must be >= 0")


CW_PRICED_PER_METRIC = {"cloudwatch:GetMetricData"}
"""GetMetricData is billed per metric requested; every other CloudWatch call per request. The
other services' calls are billed by what they carry (DynamoDB units, SNS publishes, Logs bytes)
or not at all (control-plane reads of SageMaker, EKS, STS, the Step Functions API)."""


@dataclasses.dataclass
class Usage:
    """Monthly usage of one part (the agents, the idle stack, the alarms), in billable units."""

    metric_months: float = 0.0
    alarm_metric_months_standard: float = 0.0
    alarm_metric_months_high_res: float = 0.0
    dashboards: int = 0
    cw_requests: float = 0.0
    cw_metrics_requested: float = 0.0
    log_bytes: float = 0.0
    lambda_requests: float = 0.0
    lambda_gb_seconds: float = 0.0
    transitions: float = 0.0
    ddb_wru: float = 0.0
    ddb_rru: float = 0.0
    sns_publishes: float = 0.0
    sns_emails: float = 0.0
    xray_traces: float = 0.0
    kms_keys: int = 0
    kms_requests: float = 0.0
    scheduler_invocations: float = 0.0

    def add(self, other: Usage, times: float = 1.0) -> Usage:
        """This plus ``times`` x ``other`` (a new Usage)."""
        return Usage(
            **{
                f.name: getattr(self, f.name) + times * getattr(other, f.name)
                for f in dataclasses.fields(self)
            }
        )


def dollars(
    usage: Usage, prices: dict[str, float], *, log_retention_days: float
) -> dict[str, float]:
    """Monthly $ per service for ``usage`` (no free tier subtracted). Log storage is the steady
    state: a month of ingestion kept ``log_retention_days``, uncompressed (an upper bound)."""
    gb = usage.log_bytes / 1e9
    return {
        "CloudWatch metrics": usage.metric_months * prices["custom_metric_month"],
        "CloudWatch alarms": usage.alarm_metric_months_standard
        * prices["alarm_metric_month_standard"]
        + usage.alarm_metric_months_high_res * prices["alarm_metric_month_high_res"],
        "CloudWatch dashboard": usage.dashboards * prices["dashboard_month"],
        "CloudWatch API": usage.cw_requests / 1000 * prices["cw_requests_per_1k"]
        + usage.cw_metrics_requested / 1000 * prices["get_metric_data_per_1k_metrics"],
        "CloudWatch Logs": gb * prices["logs_ingest_gb"]
        + gb * (log_retention_days / DAYS_PER_MONTH) * prices["logs_storage_gb_month"],
        "Lambda": usage.lambda_requests / 1e6 * prices["lambda_per_1m_requests"]
        + usage.lambda_gb_seconds * prices["lambda_gb_second_arm"],
        "Step Functions": usage.transitions / 1000 * prices["sfn_per_1k_transitions"],
        "DynamoDB": usage.ddb_wru / 1e6 * prices["ddb_per_1m_wru"]
        + usage.ddb_rru / 1e6 * prices["ddb_per_1m_rru"],
        "SNS": usage.sns_publishes / 1e6 * prices["sns_per_1m_publishes"]
        + usage.sns_emails / 1e5 * prices["sns_email_per_100k"],
        "X-Ray": usage.xray_traces / 1e6 * prices["xray_per_1m_traces"],
        "KMS": usage.kms_keys * prices["kms_key_month"]
        + usage.kms_requests / 1e4 * prices["kms_per_10k_requests"],
        "EventBridge Scheduler": usage.scheduler_invocations
        / 1e6
        * prices["scheduler_per_1m_invocations"],
    }


def _cw_requests(operations: dict[str, int]) -> float:
    return float(
        sum(
            n
            for op, n in operations.items()
            if op.startswith("cloudwatch:") and op not in CW_PRICED_PER_METRIC
        )
    )


def agent_usage(
    agent: dict[str, Any], *, jobs: int, ranks_per_job: int, alarms_per_month: float, a: Assumptions
) -> Usage:
    """The agents of ``jobs`` jobs for a month: liveness series and their PutMetricData, rank
    maps at each start, and the alarms' metrics and reports."""
    live = agent["liveness"]
    sends_per_hour = 3600.0 / agent["liveness_interval_s"]
    alarm = agent["alarm"]
    starts = jobs * a.job_starts_per_day * DAYS_PER_MONTH
    return Usage(
        # Every liveness series gets data every interval: a whole metric-month each; an alarm's
        # series get one datapoint, billed for the hour it arrived in.
        metric_months=jobs * len(live["series"])
        + alarms_per_month * len(alarm["series"]) / HOURS_PER_MONTH,
        cw_requests=jobs * sends_per_hour * HOURS_PER_MONTH
        + alarms_per_month * alarm["operations"].get("cloudwatch:PutMetricData", 0),
        log_bytes=starts * agent["rank_map_bytes_per_rank"] * ranks_per_job
        + alarms_per_month * alarm["log_bytes"],
    )


def billed_gb_seconds(
    functions: dict[str, dict[str, Any]], memory_mb: dict[str, int], floor_s: float
) -> float:
    """GB-s of the invocations of each function: its measured seconds, at least ``floor_s`` per
    invocation, times its configured memory."""
    return sum(
        max(f["seconds"], floor_s * f["invocations"]) * memory_mb.get(name, 128) / 1024
        for name, f in functions.items()
    )


def phase_usage(
    phase: dict[str, Any],
    *,
    runs: float,
    scheduled: bool,
    metric_hours_per_series: float,
    gb_seconds: float,
    extra: dict[str, Any] | None = None,
) -> Usage:
    """``runs`` repetitions of a measured phase in a month; ``metric_hours_per_series`` is how
    many hours a month each custom metric series it writes (PutMetricData and EMF) has data;
    ``gb_seconds`` the Lambda GB-s of one run (:func:`billed_gb_seconds`)."""
    extra = extra or {}
    series = len(phase["emf_series"]) + len(phase["put_metric_data_series"])
    invocations = phase["invocations"] + extra.get("invocations", 0)
    return Usage(
        metric_months=series * min(HOURS_PER_MONTH, metric_hours_per_series) / HOURS_PER_MONTH,
        cw_requests=runs * _cw_requests(phase["operations"]),
        cw_metrics_requested=runs * phase["get_metric_data_metrics"],
        log_bytes=runs
        * (phase["lambda_log_bytes"] + phase["state_log_bytes"] + extra.get("log_bytes", 0)),
        lambda_requests=runs * invocations,
        lambda_gb_seconds=runs * (gb_seconds + extra.get("gb_seconds", 0.0)),
        transitions=runs * (phase["transitions"] + extra.get("transitions", 0)),
        ddb_wru=runs * phase["ddb_wru"],
        ddb_rru=runs * phase["ddb_rru"],
        sns_publishes=runs * phase["sns_publishes"],
        kms_requests=runs * phase["sns_publishes"],
        xray_traces=runs * (phase["executions"] + phase["invocations_outside_workflows"]),
        scheduler_invocations=runs if scheduled else 0.0,
    )


def poll_extrapolation(stack: dict[str, Any], a: Assumptions) -> dict[str, Any]:
    """What a real deep health check adds to the measured alarm: more polls of the same loop."""
    alarm = stack["alarm"]
    poll_s = stack["production"]["health_check_poll_s"]
    measured = alarm["states"].get("PollHealthCheck", 0)
    real = math.ceil(a.health_check_minutes * 60 / poll_s) if poll_s else measured
    extra = max(0, real - measured)
    poll = alarm["functions"].get(
        "poll_health_check", {"invocations": 1, "seconds": 0.0, "log_bytes": 0}
    )
    per = max(1, poll["invocations"])
    memory = stack["production"]["memory_mb"].get("poll_health_check", 256) / 1024
    return {
        "measured_polls": measured,
        "real_polls": real,
        "invocations": extra,
        "transitions": extra * stack["poll_loop_transitions"],
        "gb_seconds": extra * max(poll["seconds"] / per, a.lambda_seconds) * memory,
        "log_bytes": extra * poll["log_bytes"] / per,
    }


def _gb_s(stack: dict[str, Any], phase: str, a: Assumptions) -> float:
    return billed_gb_seconds(
        stack[phase]["functions"], stack["production"]["memory_mb"], a.lambda_seconds
    )


def ledger_bytes(stack: dict[str, Any], a: Assumptions, alarms_per_day: float) -> float:
    """The ledger's size after ``a.ledger_months``: what it held at the start, plus what each
    canary run and each remediation added in the measurement and keeps, plus the items its TTL
    removes (a canary run's own) for as long as they are kept."""
    canary_s = stack["production"]["schedules_s"].get("canary")
    days = a.ledger_months * DAYS_PER_MONTH
    kept_per_day = alarms_per_day * stack["alarm"]["ledger_kept_added"]
    expiring = alarms_per_day * stack["alarm"]["ledger_expiring_added"]
    if canary_s:
        kept_per_day += 86400 / canary_s * stack["canary"]["ledger_kept_added"]
        expiring += 86400 / canary_s * stack["canary"]["ledger_expiring_added"]
    retention_days = stack["canary_run_retention_s"] / 86400
    return (
        stack["alarm"]["ledger_bytes_before"]
        + days * kept_per_day
        + min(days, retention_days) * expiring
    )


def stack_idle_usage(stack: dict[str, Any], a: Assumptions, alarms_per_day: float = 0.0) -> Usage:
    """The stack with no alarm: its alarms, dashboard and key, the sweeper and the canary.
    ``alarms_per_day`` only sizes the ledger the sweeper scans."""
    prod = stack["production"]
    usage = Usage(dashboards=prod["dashboards"], kms_keys=prod["kms_keys"])
    for alarm in prod["alarms"]:
        # A Metrics Insights alarm is billed per metric its query analyzes: here each job's
        # series of one SDC metric, which exist only after a finding; counted as one.
        metrics = max(1, alarm["metrics"])
        if alarm["period"] < 60:
            usage.alarm_metric_months_high_res += metrics
        else:
            usage.alarm_metric_months_standard += metrics
    schedules = prod["schedules_s"]
    month_s = DAYS_PER_MONTH * 86400
    sweeps = month_s / schedules["sweeper"]
    sweep = dict(stack["sweep"])
    # Each sweep scans the ledger as it will be, not as small as in the measurement.
    sweep["ddb_rru"] += (
        read_units([int(ledger_bytes(stack, a, alarms_per_day))], consistent=True) * sweep["scans"]
        - sweep["scan_rru"]
    )
    usage = usage.add(
        phase_usage(
            sweep,
            runs=sweeps,
            scheduled=True,
            metric_hours_per_series=HOURS_PER_MONTH,
            gb_seconds=_gb_s(stack, "sweep", a),
        )
    )
    if "canary" in schedules:
        runs = month_s / schedules["canary"]
        usage = usage.add(
            phase_usage(
                stack["canary"],
                runs=runs,
                scheduled=True,
                metric_hours_per_series=runs,
                gb_seconds=_gb_s(stack, "canary", a),
            )
        )
    return usage


def stack_alarm_usage(stack: dict[str, Any], a: Assumptions, alarms_per_month: float) -> Usage:
    """``alarms_per_month`` remediations like the measured one, with a real health check."""
    extra = poll_extrapolation(stack, a)
    usage = phase_usage(
        stack["alarm"],
        runs=alarms_per_month,
        scheduled=False,
        metric_hours_per_series=alarms_per_month,
        gb_seconds=_gb_s(stack, "alarm", a),
        extra=extra,
    )
    usage.sns_emails = alarms_per_month * stack["alarm"]["sns_publishes"] * a.email_subscribers
    return usage


def monthly(
    agent: dict[str, Any],
    stack: dict[str, Any] | None,
    *,
    nodes: int,
    alarms_per_day: float,
    a: Assumptions,
    prices: dict[str, float] = PRICES,
) -> dict[str, dict[str, float]]:
    """Monthly $ per service for the agents and for the stack, at ``nodes`` nodes."""
    jobs = math.ceil(nodes / a.nodes_per_job)
    ranks_per_job = min(nodes, a.nodes_per_job) * a.gpus_per_node
    alarms_per_month = alarms_per_day * DAYS_PER_MONTH
    retention = (stack or {}).get("production", {}).get("log_retention_days") or 30
    out = {
        "agents": dollars(
            agent_usage(
                agent,
                jobs=jobs,
                ranks_per_job=ranks_per_job,
                alarms_per_month=alarms_per_month,
                a=a,
            ),
            prices,
            log_retention_days=retention,
        ),
    }
    if stack is not None:
        usage = stack_idle_usage(stack, a, alarms_per_day)
        if alarms_per_month:
            usage = usage.add(stack_alarm_usage(stack, a, alarms_per_month))
        out["stack"] = dollars(usage, prices, log_retention_days=retention)
    return out


def total(parts: dict[str, dict[str, float]]) -> float:
    """Sum over parts and services."""
    return sum(sum(p.values()) for p in parts.values())
