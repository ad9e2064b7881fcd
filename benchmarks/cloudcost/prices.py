"""The list prices the bill is computed from, and the month they are multiplied over.

One table, apart from the code that multiplies it, so that a price checked against the AWS
pricing pages is changed in one place and nowhere else; the region and the date it was written
down travel with it into every printout and every ``--json`` file.
"""

from __future__ import annotations

PRICES_REGION = "us-east-1"
PRICES_DATE = "2026-12-01"
"""The day this table was written down: list prices as known then, NOT fetched (this machine
has no internet). Check them against the AWS pricing pages for CloudWatch, AWS Lambda, AWS Step
Functions, Amazon DynamoDB, Amazon SNS, AWS X-Ray, AWS KMS and Amazon EventBridge."""

PRICES: dict[str, float] = {
    # Amazon CloudWatch
    "custom_metric_month": 0.30,  # first 10,000 metrics; pro-rated by the hour with data
    "alarm_metric_month_standard": 0.10,  # per metric an alarm evaluates (60 s period)
    "alarm_metric_month_high_res": 0.30,  # period under 60 s
    "dashboard_month": 3.00,  # per dashboard beyond the account's first 3
    "cw_requests_per_1k": 0.01,  # PutMetricData, ListMetrics, DescribeAlarms, ...
    "get_metric_data_per_1k_metrics": 0.01,  # GetMetricData: per metric requested
    "logs_ingest_gb": 0.50,  # standard and vended (Step Functions) logs, first 10 TB
    "logs_storage_gb_month": 0.03,
    # AWS Lambda (arm64, the stack's architecture)
    "lambda_per_1m_requests": 0.20,
    "lambda_gb_second_arm": 0.0000133334,
    # AWS Step Functions, Standard workflows
    "sfn_per_1k_transitions": 0.025,
    # Amazon DynamoDB on-demand (the stack's billing mode). These are the prices before the
    # November 2024 cut; the cut halved the write price, so these are an upper bound.
    "ddb_per_1m_wru": 1.25,
    "ddb_per_1m_rru": 0.25,
    # Amazon SNS
    "sns_per_1m_publishes": 0.50,
    "sns_email_per_100k": 2.00,  # deliveries to email endpoints, beyond the first 1,000
    # AWS X-Ray (active tracing on the functions and the state machine)
    "xray_per_1m_traces": 5.00,
    # AWS KMS (the topic's customer managed key)
    "kms_key_month": 1.00,
    "kms_per_10k_requests": 0.03,
    # Amazon EventBridge Scheduler (sweeper, canary)
    "scheduler_per_1m_invocations": 1.00,
    # Amazon EC2 p5.48xlarge (8 H100 SXM), on-demand, after the June 2025 price cut (list price
    # as known, not fetched; it was 98.32 before). The node screen's cost (docs/cost.md).
    "p5_48xlarge_hour": 55.04,
}

HOURS_PER_MONTH = 730.0
DAYS_PER_MONTH = HOURS_PER_MONTH / 24.0
