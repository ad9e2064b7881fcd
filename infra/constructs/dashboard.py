"""The operations dashboard: what the agent sees, whether its checks still run, what the
workflow did, and which remediations are open."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import LIVENESS_METRIC_NAMES, METRIC_NAMES, SdcConfig
from infra.constructs.functions import POWERTOOLS_METRICS_NAMESPACE, POWERTOOLS_SERVICE_NAME
from sdc_contract.idle_screen import IDLE_SCREEN_METRICS, NODES_UNSCREENED_METRIC

# Transitions after which the node is back in service or gone (the ledger closes the
# remediation), and the ones that never opened one.
CLOSING_TRANSITIONS = ("released", "replaced", "replaced_by_hyperpod")
NOT_OPENING_TRANSITIONS = ("duplicate", "circuit_open", "ambiguous", "no_suspects")


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def _any_metric(names: Sequence[str]) -> str:
    """A SEARCH term matching any of ``names``."""
    return " OR ".join(f'MetricName="{name}"' for name in names)


OPEN_REMEDIATIONS_QUERY = (
    # The record step logs one "recorded" line per transition (pk = instance id). A node whose
    # latest transition does not close its remediation is still cordoned and waiting for a human.
    f'filter message = "recorded" and transition not in [{_quoted(NOT_OPENING_TRANSITIONS)}]\n'
    "| stats latest(transition) as last_transition, latest(remediation_id) as remediation, "
    "max(@timestamp) as since by pk\n"
    f"| filter last_transition not in [{_quoted(CLOSING_TRANSITIONS)}]\n"
    "| sort since desc"
)

SWEEPER_HEALTH_METRICS = (
    "series_flood",
    "flood_watch_failed",
    "reminder_failed",
    "notice_failed",
    "backstop_started",
)
"""What the sweeper puts only when something is wrong (lambdas/sdc_remediation/logic/sweeper.py):
an SDC alarm's series near its 500-series limit (the flood watch), the watch, the held-node
reminder or the abandoned notice failing, and the backstop starting workflows no alarm started."""

SCREEN_OUTCOME_METRICS = tuple(m for m in IDLE_SCREEN_METRICS if m != NODES_UNSCREENED_METRIC)
"""The idle screener's counts per screen (started, and each outcome): the "Screens" graph."""

_ONE_MINUTE = cdk.Duration.minutes(1)
_FIVE_MINUTES = cdk.Duration.minutes(5)


def search(
    expression: str, statistic: str, period: cdk.Duration, label: str
) -> cloudwatch.MathExpression:
    """A CloudWatch SEARCH over a metric schema: one line per job/node, found at view time."""
    return cloudwatch.MathExpression(
        expression=f"SEARCH('{expression}', '{statistic}', {int(period.to_seconds())})",
        using_metrics={},
        label=label,
        period=period,
    )


class Dashboard(Construct):
    """One CloudWatch dashboard per protected cluster."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        alarms: Mapping[str, cloudwatch.IAlarm],
        state_machine: sfn.IStateMachine,
        functions: Sequence[lambda_.IFunction],
        dead_letter_queue: sqs.IQueue,
        record_log_group: logs.ILogGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        cluster = config.hyperpod_cluster_name
        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=config.resource_prefix,
            default_interval=cdk.Duration.hours(24),
        )
        self.dashboard.add_widgets(
            cloudwatch.TextWidget(
                markdown=(
                    f"# sdc-guard: {cluster}\n"
                    "Silent-data-corruption findings from the training jobs' agents, and what the "
                    "remediation workflow did about them. Approve or reject pending replacements "
                    "with `sdc-remediation pending` / `approve ID` / `reject ID [--release]`."
                ),
                width=24,
                height=2,
            )
        )
        # The cluster series the alarms watch, with their thresholds.
        self.dashboard.add_widgets(
            *(
                cloudwatch.AlarmWidget(alarm=alarm, title=f"{name} (cluster)", width=8, height=6)
                for name, alarm in alarms.items()
            )
        )
        # The per-node series localize reads: which job and node each finding came from.
        self.dashboard.add_widgets(
            *(
                cloudwatch.GraphWidget(
                    title=f"{name} by job and node",
                    left=[
                        search(
                            f'{{{config.namespace},ClusterName,JobName,NodeName}} ClusterName="{cluster}" MetricName="{name}"',
                            "Sum",
                            _ONE_MINUTE,
                            label="",
                        )
                    ],
                    width=8,
                    height=6,
                    statistic="Sum",
                )
                for name in METRIC_NAMES
            )
        )
        # Liveness: a job whose checks stopped running is unprotected.
        self.dashboard.add_widgets(
            *(
                cloudwatch.GraphWidget(
                    title=f"{name} by job (liveness)",
                    left=[
                        search(
                            f'{{{config.namespace},ClusterName,JobName}} ClusterName="{cluster}" MetricName="{name}"',
                            "Sum",
                            _FIVE_MINUTES,
                            label="",
                        )
                    ],
                    width=12,
                    height=6,
                )
                for name in LIVENESS_METRIC_NAMES
            )
        )
        # Workflow outcomes: executions, and the transitions the record step counted.
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Workflow executions",
                left=[
                    state_machine.metric_started(
                        period=_FIVE_MINUTES, statistic="Sum", label="started"
                    ),
                    state_machine.metric_succeeded(
                        period=_FIVE_MINUTES, statistic="Sum", label="succeeded"
                    ),
                    state_machine.metric_failed(
                        period=_FIVE_MINUTES, statistic="Sum", label="failed"
                    ),
                    state_machine.metric_timed_out(
                        period=_FIVE_MINUTES, statistic="Sum", label="timed out"
                    ),
                    dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=_FIVE_MINUTES, statistic="Maximum", label="undelivered alarm events"
                    ),
                ],
                width=8,
                height=6,
            ),
            cloudwatch.GraphWidget(
                title="Remediation transitions",
                left=[
                    # The record step counts each transition (metric name = transition) with
                    # Powertools' service dimension and ClusterName.
                    search(
                        f'{{{POWERTOOLS_METRICS_NAMESPACE},ClusterName,service}} ClusterName="{cluster}"',
                        "Sum",
                        _FIVE_MINUTES,
                        label="",
                    )
                ],
                width=8,
                height=6,
            ),
            cloudwatch.TableWidget(
                title="Outcomes per check x verdict (precision: `sdc-remediation stats`)",
                metrics=[
                    # The record step counts each outcome by check and verdict
                    # (sdc_remediation.logic.recording.OUTCOME_METRICS): one row per metric, check
                    # and verdict, summed over the dashboard's time range.
                    search(
                        # Powertools adds its `service` dimension to every metric.
                        f"{{{POWERTOOLS_METRICS_NAMESPACE},ClusterName,Check,Verdict,service}} "
                        f'ClusterName="{cluster}"',
                        "Sum",
                        cdk.Duration.days(1),
                        label="",
                    )
                ],
                summary=cloudwatch.TableSummaryProps(
                    columns=[cloudwatch.TableSummaryColumn.SUM], hide_non_summary_columns=True
                ),
                set_period_to_time_range=True,
                width=8,
                height=6,
            ),
            cloudwatch.LogQueryWidget(
                title="Open remediations (nodes cordoned, not yet released or replaced)",
                log_group_names=[record_log_group.log_group_name],
                query_string=OPEN_REMEDIATIONS_QUERY,
                view=cloudwatch.LogQueryVisualizationType.TABLE,
                width=8,
                height=6,
            ),
        )
        # Whether the alarms can still see: the sweeper's flood watch and its backstop. Each
        # line exists only in the hours something was wrong (an empty graph is all well).
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title=(
                    "Alarm blindness: job series near the 500 limit, watch/reminder failures, "
                    "workflows started by the backstop"
                ),
                left=[
                    search(
                        f"{{{POWERTOOLS_METRICS_NAMESPACE},ClusterName,service}} "
                        f'ClusterName="{cluster}" ({_any_metric(SWEEPER_HEALTH_METRICS)})',
                        "Maximum",
                        _FIVE_MINUTES,
                        label="",
                    )
                ],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(
                        value=config.flood_watch_fraction * 500,
                        label="flood watch tells (floodWatchFraction x 500)",
                    )
                ],
                width=24,
                height=6,
            )
        )
        if config.idle_screen_enabled:
            self._add_screens(config)
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Step function errors",
                left=[fn.metric_errors(period=_FIVE_MINUTES, statistic="Sum") for fn in functions],
                width=12,
                height=6,
            ),
            cloudwatch.GraphWidget(
                title="Step function throttles",
                left=[
                    fn.metric_throttles(period=_FIVE_MINUTES, statistic="Sum") for fn in functions
                ],
                width=12,
                height=6,
            ),
        )

    def _add_screens(self, config: SdcConfig) -> None:
        """The idle screener's row: screens by outcome, and how many nodes went unscreened for
        longer than the rescreen age (the screener puts it every run, so a flat line that stops
        means the screener stopped)."""
        cluster = config.hyperpod_cluster_name
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Screens: idle-node screens started and their outcomes",
                left=[
                    # Powertools adds its `service` dimension to every metric.
                    search(
                        f"{{{POWERTOOLS_METRICS_NAMESPACE},ClusterName,service}} "
                        f'ClusterName="{cluster}" ({_any_metric(SCREEN_OUTCOME_METRICS)})',
                        "Sum",
                        cdk.Duration.hours(1),
                        label="",
                    )
                ],
                width=16,
                height=6,
            ),
            cloudwatch.SingleValueWidget(
                title=f"Nodes not screened within {config.screen_rescreen_days} days",
                metrics=[
                    cloudwatch.Metric(
                        namespace=POWERTOOLS_METRICS_NAMESPACE,
                        metric_name=NODES_UNSCREENED_METRIC,
                        dimensions_map={
                            "ClusterName": cluster,
                            "service": POWERTOOLS_SERVICE_NAME,
                        },
                        statistic=cloudwatch.Stats.MAXIMUM,
                        period=cdk.Duration.hours(1),
                        label=NODES_UNSCREENED_METRIC,
                    )
                ],
                # The trend, not only the latest count: a backlog that never shrinks means the
                # cluster is never idle enough, or screenIdleMaxNodes is too low.
                sparkline=True,
                width=8,
                height=6,
            ),
        )

    @property
    def url(self) -> str:
        """Console URL of the dashboard."""
        stack = cdk.Stack.of(self)
        return (
            f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region={stack.region}"
            f"#dashboards/dashboard/{self.dashboard.dashboard_name}"
        )
