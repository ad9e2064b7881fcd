"""What the training job's agent may do: publish the SDC metrics and write its reports.

Attach the managed policy to the role the training pods run as (EKS Pod Identity or IRSA), then
install the agent with boto3 in the training image (`pip install "./agent[aws]"` from a clone of
this repository: it is not on PyPI). The stack grants it what it holds: the SDC
namespace (`SdcAlarms.grant_put_metric_data`) and the report group
(`ReportLogGroup.grant_write_job_reports`).
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import SdcConfig


class AgentPolicy(Construct):
    """Managed policy for the training pods' role."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SdcConfig) -> None:
        super().__init__(scope, construct_id)
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description=f"sdc-guard agent in training jobs on {config.hyperpod_cluster_name}: publish SDC metrics and reports",
        )
