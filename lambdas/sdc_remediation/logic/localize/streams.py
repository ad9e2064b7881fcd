"""Which report streams speak for which job (REPORT_STREAMS).

- ``job`` (``agentIdentity: shared``): a job's reports are in the stream named by the job. Any
  pod the agent's policy is attached to may write any job's stream, so the stream proves
  nothing about the writer (lambdas/README, "still trusted").
- ``pod`` (``agentIdentity: pod-identity``): each pod writes only ``<namespace>/<job>/<pod>``
  (``sdc_contract.metrics.pod_report_stream``): IAM checks the namespace and the pod name
  against EKS Pod Identity's session tags, which the pod cannot choose. A job's reports are then
  read only from streams under ``<TRAINING_NAMESPACE>/<job>/``, and the writing pod must be
  the job's (``RankResolver.verify_writer``: its job-name label, and its training operator's
  owner reference where the operator runs the job). The canary's report, written by the
  canary function, stays in the canary job's own stream, and so does each reserved job's
  (``sdc_contract.RESERVED_JOBS``: the idle screener's too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sdc_contract as contract

from ...config import Settings


@dataclass(frozen=True)
class StreamFilter:
    """One FilterLogEvents selection: stream names, or a stream name prefix."""

    names: tuple[str, ...] | None = None
    prefix: str | None = None


@dataclass(frozen=True)
class ReportStreams:
    """How this stack's agents name their report streams, and which stream is whose."""

    mode: str = contract.REPORT_STREAM_JOB
    namespace: str = "default"

    @classmethod
    def from_settings(cls, settings: Settings) -> ReportStreams:
        """REPORT_STREAMS and TRAINING_NAMESPACE."""
        return cls(mode=settings.report_streams, namespace=settings.training_namespace)

    @property
    def per_pod(self) -> bool:
        """Whether streams are named by the writing pod."""
        return self.mode == contract.REPORT_STREAM_POD

    def filters(self, jobs: Iterable[str] | None) -> list[StreamFilter]:
        """What to read for ``jobs`` (None: every job's, the canary's included)."""
        if not self.per_pod:
            names = tuple(sorted(set(jobs))) if jobs is not None else None
            return [StreamFilter(names=names or None)]
        if jobs is None:
            return [
                StreamFilter(prefix=f"{self.namespace}/"),
                StreamFilter(names=contract.RESERVED_JOBS),
            ]
        return [
            StreamFilter(names=(job,))
            if job in contract.RESERVED_JOBS
            else StreamFilter(prefix=contract.pod_stream_prefix(self.namespace, job))
            for job in sorted(set(jobs))
        ]

    def accepts(self, stream: str, job: str) -> bool:
        """Whether a report of ``job`` may come from ``stream``. Streams named by the job
        accept anything here (the filter picked the job's stream; the writer is not known).
        Per pod: one of the job's pods' streams, or a reserved job's own stream for it (the
        canary's, the idle screen's: written by sdc-guard's functions, never by a pod)."""
        if not self.per_pod:
            return True
        if job in contract.RESERVED_JOBS:
            return stream == job
        return self.writer(stream, job) is not None

    def writer(self, stream: str, job: str) -> str | None:
        """The pod that wrote ``stream`` for ``job`` (per-pod streams of a training job only);
        None otherwise."""
        if not self.per_pod or job in contract.RESERVED_JOBS:
            return None
        return contract.pod_of_report_stream(stream, self.namespace, job)


__all__ = ["ReportStreams", "StreamFilter"]
