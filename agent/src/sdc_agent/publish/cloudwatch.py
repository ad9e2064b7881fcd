"""CloudWatchPublisher: the guard's alarms, liveness and rank map to CloudWatch, never blocking."""

from __future__ import annotations

import logging
from typing import Any

from ..alarm import Alarm, RankInfo
from . import lifecycle
from .events import alarm_delivery, rankmap_deliveries, utc_now_iso
from .sender import Sender
from .settings import PublishConfigError, PublishSettings
from .spool import Spool
from .transport import CloudWatchTransport

logger = logging.getLogger(__name__)

DEFAULT_FLUSH_TIMEOUT = 30.0
"""Seconds ``flush()`` waits when called without a timeout."""


class CloudWatchPublisher:
    """Publishes to CloudWatch metrics and Logs from a background thread (the Publisher protocol).

    Pass it to ``sdc.Guard(..., publisher=CloudWatchPublisher())`` on every rank; the guard calls
    it from DP rank 0 only, and nothing starts (no thread, no connection) on a rank that is never
    called. Arguments override the environment (see :meth:`PublishSettings.from_env`); boto3's
    own configuration applies to credentials, region and ``AWS_ENDPOINT_URL``. Raises
    PublishConfigError naming what is missing; after construction nothing raises into training.

    ``report_stream`` ("job" or "pod"), ``pod_namespace`` and ``pod_name`` override
    SDC_REPORT_STREAM, POD_NAMESPACE and POD_NAME: "pod" writes to the pod's own stream
    ``<namespace>/<job>/<pod>``, the only one a stack deployed with ``agentIdentity:
    pod-identity`` lets the pod write.

    ``cloudwatch_client`` / ``logs_client`` replace the boto3 clients (tests, custom sessions);
    other keyword options are PublishSettings fields (``spool_dir``, ``queue_size``,
    ``liveness_interval``, ``connect_timeout``, ``read_timeout``, ``retry``, ...).
    """

    def __init__(
        self,
        cluster_name: str | None = None,
        job_name: str | None = None,
        namespace: str | None = None,
        log_group: str | None = None,
        region: str | None = None,
        *,
        cloudwatch_client: Any = None,
        logs_client: Any = None,
        report_stream: str | None = None,
        pod_namespace: str | None = None,
        pod_name: str | None = None,
        **options: Any,
    ) -> None:
        self.settings = PublishSettings.from_env(
            cluster_name=cluster_name,
            job_name=job_name,
            namespace=namespace,
            log_group=log_group,
            region=region,
            report_stream=report_stream,
            pod_namespace=pod_namespace,
            pod_name=pod_name,
            **options,
        )
        if cloudwatch_client is None or logs_client is None:
            cloudwatch_client, logs_client = _boto3_clients(
                self.settings, cloudwatch_client, logs_client
            )
        self.region: str | None = getattr(
            getattr(cloudwatch_client, "meta", None), "region_name", None
        )
        """The region the CloudWatch client sends to."""
        self._sender = Sender(
            self.settings,
            CloudWatchTransport(cloudwatch_client, logs_client),
            Spool.for_job(self.settings),
        )
        lifecycle.register(self)
        if self.spool.records():
            # Leftovers of an earlier run on this node (a hostPath spool): send them now from
            # whichever rank finds them, since this node may never host DP rank 0 again.
            self._sender.start()

    @property
    def spool(self) -> Spool:
        """The local spool this publisher falls back to."""
        return self._sender.spool

    def publish_rank_map(self, ranks: dict[int, RankInfo]) -> None:
        """Queue the ``sdc.rankmap/v1`` event(s) for the log stream; returns at once."""
        try:
            logger.info(
                "sdc: rank map of %d ranks on %d nodes",
                len(ranks),
                len({info.node_name for info in ranks.values()}),
            )
            for delivery in rankmap_deliveries(
                ranks,
                cluster=self.settings.cluster_name,
                job=self.settings.job_name,
                namespace=self.settings.namespace,
                log_group=self.settings.log_group,
                time=utc_now_iso(),
                log_stream=self.settings.log_stream,
            ):
                self._sender.submit(delivery)
        except Exception:
            logger.exception("sdc: could not publish the rank map")

    def publish_alarm(self, alarm: Alarm) -> None:
        """Queue the alarm's report and metrics; returns at once, spools if it cannot queue."""
        try:
            delivery = alarm_delivery(
                alarm,
                cluster=self.settings.cluster_name,
                job=self.settings.job_name,
                namespace=self.settings.namespace,
                log_group=self.settings.log_group,
                time=utc_now_iso(),
                log_stream=self.settings.log_stream,
            )
        except Exception:
            logger.exception("sdc: could not build the alarm report; the alarm was %r", alarm)
            return
        try:
            self._sender.submit(delivery)
        except Exception:
            logger.exception("sdc: could not queue the alarm")
            self._sender.spool_or_log(delivery)

    def publish_liveness(self, step: int, audit_passes: int, weight_check_passes: int) -> None:
        """Count passing checks; sent in batches, at most once per ``liveness_interval``."""
        try:
            self._sender.add_liveness(step, audit_passes, weight_check_passes)
        except Exception:
            logger.exception("sdc: could not count liveness")

    def publish_unconfirmed_sensor_flags(self, step: int, count: int) -> None:
        """Count sensor candidates the replays did not confirm; sent with the liveness batch
        as ``sdc_unconfirmed_sensor_flags`` (never an SDC metric)."""
        try:
            self._sender.add_liveness(step, 0, 0, unconfirmed_sensor_flags=count)
        except Exception:
            logger.exception("sdc: could not count unconfirmed sensor flags")

    def publish_audit_skipped(self, step: int, count: int) -> None:
        """Count audits that did not run or could not judge; sent with the liveness batch as
        ``sdc_audit_skipped`` (never an SDC metric: an alarm on it catches an unprotected job)."""
        try:
            self._sender.add_liveness(step, 0, 0, audits_skipped=count)
        except Exception:
            logger.exception("sdc: could not count skipped audits")

    def flush(self, timeout: float | None = None) -> bool:
        """Deliver what is queued, pending liveness and the spool, within ``timeout`` seconds.

        None means DEFAULT_FLUSH_TIMEOUT. On timeout, what is left is spooled. True when
        nothing is left to send.
        """
        try:
            return self._sender.flush(DEFAULT_FLUSH_TIMEOUT if timeout is None else timeout)
        except Exception:
            logger.exception("sdc: flush failed")
            return False

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the sender; anything published afterwards is spooled directly."""
        try:
            return self._sender.close(DEFAULT_FLUSH_TIMEOUT if timeout is None else timeout)
        except Exception:
            logger.exception("sdc: close failed")
            return False


def _boto3_clients(settings: PublishSettings, cloudwatch: Any, logs: Any) -> tuple[Any, Any]:
    """CloudWatch and Logs clients with short timeouts and botocore's own retries off.

    The sender retries with its own backoff, so a call's worst case stays bounded and known;
    botocore's retries on top would multiply it.
    """
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise ImportError(
            "CloudWatchPublisher needs boto3: pip install boto3 (from a clone of sdc-guard, "
            "pip install './agent[aws]' does it; the agent is not on PyPI)"
        ) from exc
    session = boto3.session.Session(region_name=settings.region)
    if not session.region_name:
        raise PublishConfigError(
            "the AWS region is missing: pass region=... or set AWS_REGION (EKS Pod Identity and "
            "IRSA set it in the pod)"
        )
    config = Config(
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        retries={"total_max_attempts": 1, "mode": "standard"},
        user_agent_extra="sdc-agent",
    )
    if cloudwatch is None:
        cloudwatch = session.client("cloudwatch", config=config)
    if logs is None:
        logs = session.client("logs", config=config)
    return cloudwatch, logs
