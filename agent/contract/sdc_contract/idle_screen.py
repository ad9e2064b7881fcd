"""Screening idle and standby nodes (docs/deploy.md, "Screening idle nodes"): the names the
screener function, infra and the operator CLI share.

On a schedule, the idle screener runs the node screen (``python -m sdc_agent.screen``, the same
Kubernetes Job as the workflow's Screen step) on HyperPod nodes that run no training pod, oldest
screen first, a bounded number at a time. A ``reproduced`` screen enters the same workflow as an
agent's alarm: the screener writes an ``sdc.alarm/v1`` report for the reserved job
:data:`IDLE_SCREEN_JOB` naming the node, and puts a datum on :data:`IDLE_SCREEN_METRIC` in
:func:`idle_screen_namespace`, which no training pod may put into (the agent's policy allows its
own namespace only), so only the screener can raise the alarm that infra defines on it
(ALARM_NAME_PREFIX + :data:`IDLE_SCREEN_ALARM_SUFFIX`), and the same rule, admission guard,
cordon, health check, approval and replacement follow.
"""

from __future__ import annotations

from .canary import CANARY_JOB

IDLE_SCREEN_JOB = "sdc-idle-screen"
"""The reserved job of an idle node's reproduced screen: its report's ``job``, its log stream,
its series' JobName. No training job can be named this."""
RESERVED_JOBS: tuple[str, ...] = (CANARY_JOB, IDLE_SCREEN_JOB)
"""The jobs only sdc-guard's own functions publish (the canary, the idle screener): each has
its own alarm, its own namespace and its one report stream, named by the job; localize reads
each from that stream only and never mixes them with a training job's data."""
IDLE_SCREEN_METRIC = "sdc_screen_reproduced"
"""The datum a reproduced idle screen puts (value 1, dimensions ClusterName, JobName and
NodeName), in :func:`idle_screen_namespace`."""
IDLE_SCREEN_ALARM_SUFFIX = f"idle-screen-{IDLE_SCREEN_METRIC}"
"""The idle screen's alarm is named ALARM_NAME_PREFIX + this (infra)."""

SCREEN_RESCREEN_DAYS = "SCREEN_RESCREEN_DAYS"
"""Set on the idle screener (context key ``screenRescreenDays``): a node whose last screen is
older than this many days is screened again (defects appear with age)."""
DEFAULT_SCREEN_RESCREEN_DAYS = 30
MIN_SCREEN_RESCREEN_DAYS = 1
MAX_SCREEN_RESCREEN_DAYS = 365
SCREEN_IDLE_MAX_NODES = "SCREEN_IDLE_MAX_NODES"
"""Set on the idle screener (context key ``screenIdleMaxNodes``): at most this many idle-node
screens run at once in the cluster."""
DEFAULT_SCREEN_IDLE_MAX_NODES = 2
MIN_SCREEN_IDLE_MAX_NODES = 1
MAX_SCREEN_IDLE_MAX_NODES = 64
DEFAULT_SCREEN_IDLE_SCHEDULE = "rate(30 minutes)"
"""The idle screener's schedule (context key ``screenIdleSchedule``; ``"off"`` turns idle
screening off). Idle screening runs only where ``screenImage`` is set."""

# What the idle screener puts (namespace POWERTOOLS_METRICS_NAMESPACE, dimension ClusterName),
# for the dashboard's "Screens" graphs.
SCREEN_STARTED_METRIC = "idle_screen_started"
SCREEN_CLEAN_METRIC = "idle_screen_clean"
SCREEN_REPRODUCED_METRIC = "idle_screen_reproduced"
SCREEN_INCONCLUSIVE_METRIC = "idle_screen_inconclusive"
SCREEN_FAILED_METRIC = "idle_screen_failed"
SCREEN_ABORTED_METRIC = "idle_screen_aborted"
"""A screen deleted because a training pod appeared on its node (its result never counts)."""
NODES_UNSCREENED_METRIC = "nodes_unscreened"
"""How many HyperPod nodes have no screen within the rescreen age (put every run)."""
IDLE_SCREEN_METRICS: tuple[str, ...] = (
    SCREEN_STARTED_METRIC,
    SCREEN_CLEAN_METRIC,
    SCREEN_REPRODUCED_METRIC,
    SCREEN_INCONCLUSIVE_METRIC,
    SCREEN_FAILED_METRIC,
    SCREEN_ABORTED_METRIC,
    NODES_UNSCREENED_METRIC,
)


def idle_screen_namespace(namespace: str) -> str:
    """The CloudWatch namespace of a reproduced idle screen's datum and its alarm:
    ``<namespace>/Screen``, apart from the training pods' ``namespace`` (as the canary's)."""
    return f"{namespace}/Screen"


def screens_key(cluster: str) -> str:
    """The ledger table's partition key of ``cluster``'s node screens (``SCREEN#<cluster>``),
    one item per node (sort key: the node's name): its last screen and any running one."""
    return f"SCREEN#{cluster}"


__all__ = [
    "DEFAULT_SCREEN_IDLE_MAX_NODES",
    "DEFAULT_SCREEN_IDLE_SCHEDULE",
    "DEFAULT_SCREEN_RESCREEN_DAYS",
    "IDLE_SCREEN_ALARM_SUFFIX",
    "IDLE_SCREEN_JOB",
    "IDLE_SCREEN_METRIC",
    "IDLE_SCREEN_METRICS",
    "MAX_SCREEN_IDLE_MAX_NODES",
    "MAX_SCREEN_RESCREEN_DAYS",
    "MIN_SCREEN_IDLE_MAX_NODES",
    "MIN_SCREEN_RESCREEN_DAYS",
    "NODES_UNSCREENED_METRIC",
    "RESERVED_JOBS",
    "SCREEN_ABORTED_METRIC",
    "SCREEN_CLEAN_METRIC",
    "SCREEN_FAILED_METRIC",
    "SCREEN_IDLE_MAX_NODES",
    "SCREEN_INCONCLUSIVE_METRIC",
    "SCREEN_REPRODUCED_METRIC",
    "SCREEN_RESCREEN_DAYS",
    "SCREEN_STARTED_METRIC",
    "idle_screen_namespace",
    "screens_key",
]
