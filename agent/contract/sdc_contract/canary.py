"""The live canary's reserved names (docs/deploy.md, "The canary"): a job and a node that no
training job can be.

The instance id is a well-formed EC2 id of all-zero digits and "c0de", which EC2 does not hand
out to this account's HyperPod cluster; localize refuses a canary report naming any other node
and a training report naming this one, so a canary can never touch a real node. infra names the
canary's alarm and scopes its permissions with these; the functions act on them.
"""

from __future__ import annotations

from .metrics import REPLAY_MISMATCH_METRIC
from .names import node_name_of

CANARY_JOB = "sdc-canary"
"""The canary's job: its report's ``job``, its log stream, its series' JobName."""
CANARY_INSTANCE_ID = "i-0000000000000c0de"
CANARY_NODE_NAME = node_name_of(CANARY_INSTANCE_ID)
CANARY_INSTANCE_GROUP = "sdc-canary"
CANARY_METRIC = REPLAY_MISMATCH_METRIC
"""The SDC metric the canary publishes (on its own {ClusterName, JobName} series, in
``canary_namespace``)."""
CANARY_ALARM_SUFFIX = f"canary-{CANARY_METRIC}"
"""The canary's SDC alarm is named ALARM_NAME_PREFIX + this (infra/constructs/canary.py)."""
CANARY_COMPLETED_METRIC = "canary_completed"
"""Put (namespace POWERTOOLS_METRICS_NAMESPACE, dimension ClusterName) when a canary closes;
the canary alarm fires when none arrived in its window."""


def canary_namespace(namespace: str) -> str:
    """The CloudWatch namespace of the canary's datum and alarm: ``<namespace>/Canary``, apart
    from the training pods' ``namespace``. The agent's policy may put data only into
    ``namespace`` itself (StringEquals on cloudwatch:namespace), so no pod can put a datum the
    canary's alarm reads (one a minute would hold its contributor in ALARM: no canary run would
    ever start a workflow)."""
    return f"{namespace}/Canary"


def canary_runs_key(cluster: str) -> str:
    """The ledger table's partition key of ``cluster``'s canary runs (``CANARY#<cluster>``): the
    functions write the runs there and infra scopes the canary's table permissions to it."""
    return f"CANARY#{cluster}"


__all__ = [
    "CANARY_ALARM_SUFFIX",
    "CANARY_COMPLETED_METRIC",
    "CANARY_INSTANCE_GROUP",
    "CANARY_INSTANCE_ID",
    "CANARY_JOB",
    "CANARY_METRIC",
    "CANARY_NODE_NAME",
    "canary_namespace",
    "canary_runs_key",
]
