"""From reports to suspects: one per instance any report names, with the evidence that names it,
bounded (``models.state``: at most ``MAX_RANKS_PER_SUSPECT`` ranks and ``MAX_TENSOR_NAMES``
tensor names, and where the full report is in CloudWatch Logs)."""

from __future__ import annotations

from collections.abc import Callable

import sdc_contract as contract

from ...clients.kube import KubeApi
from ...config import Settings
from ...models import RankInfo, Report, Suspect
from ...models.state import MAX_RANKS_PER_SUSPECT, MAX_TENSOR_NAME_CHARS, MAX_TENSOR_NAMES
from . import canary
from .resolve import RankResolver


def verdict_for(report: Report, rank: int) -> str:
    """How the report came to name ``rank``: the confirmation's kind, or the check's reason.

    The kind is as the report has it; the suspect reads a kind outside the contract's list as
    ``unknown`` (``models.Suspect``)."""
    kinds = [v.kind for v in report.verdicts if v.suspect == rank]
    if kinds:
        return kinds[-1]
    if rank in report.culprits:
        return "culprit"
    if rank in report.nonfinite:
        return "nonfinite"
    if report.check == "weights":
        return "weights_minority"
    return "named"


def tensor_names(report: Report) -> list[str]:
    """A few of the report's divergent tensors, for the message (the report has them all)."""
    return [name[:MAX_TENSOR_NAME_CHARS] for name in report.divergent_tensors[:MAX_TENSOR_NAMES]]


def suspects_from_reports(
    reports: list[Report], settings: Settings, kube: Callable[[], KubeApi]
) -> list[Suspect]:
    """One suspect per instance named by any report (the newest report's evidence wins; the
    ranks of every report naming the instance are merged)."""
    resolver = RankResolver(settings, kube)
    by_instance: dict[str, Suspect] = {}
    for report in reports:  # oldest first, so later reports overwrite the evidence
        if report.job == contract.CANARY_JOB or report.canary_run is not None:
            suspect = canary_suspect(report, settings)
            by_instance[suspect.instance_id] = suspect
            continue
        canary.refuse_reserved_node(report)
        for rank in sorted(set(report.suspects or [])):
            info = resolver.rank_info(report, rank)
            node, instance_id = resolver.verified_node(info, rank, report.job)
            group = resolver.instance_group(instance_id)
            previous = by_instance.get(instance_id)
            ranks = dict(previous.ranks) if previous else {}
            named = (previous.rank_count if previous else 0) + (str(rank) not in ranks)
            if len(ranks) < MAX_RANKS_PER_SUSPECT or str(rank) in ranks:
                # Where the rank runs is the suspect's node; only what tells ranks apart stays.
                ranks[str(rank)] = RankInfo(gpu_uuid=info.gpu_uuid, local_rank=info.local_rank)
            by_instance[instance_id] = Suspect(
                node_name=node,
                instance_id=instance_id,
                instance_group=group,
                job=report.job,
                ranks=ranks,
                rank_count=named,
                check=report.check,
                verdict=verdict_for(report, rank),
                step=report.step,
                suspect_window=list(report.suspect_window),
                last_audit_pass=report.last_audit_pass,
                last_weight_check_pass=report.last_weight_check_pass,
                divergent_tensors=tensor_names(report),
                divergent_tensor_count=len(report.divergent_tensors),
                nonfinite_count=len(report.nonfinite),
                report_log_group=settings.report_log_group,
                report_log_stream=report.log_stream,
            )
    return sorted(by_instance.values(), key=lambda s: s.node_name)


def canary_suspect(report: Report, settings: Settings) -> Suspect:
    """The reserved canary node as a suspect, for a report ``canary.verify_report`` accepts (it
    is no HyperPod instance: nothing asks HyperPod or Kubernetes about it)."""
    run_id = canary.verify_report(report, settings)
    ranks = sorted(set(report.suspects or []))
    return Suspect(
        node_name=contract.CANARY_NODE_NAME,
        instance_id=contract.CANARY_INSTANCE_ID,
        instance_group=contract.CANARY_INSTANCE_GROUP,
        job=report.job,
        ranks={str(rank): RankInfo() for rank in ranks[:MAX_RANKS_PER_SUSPECT]},
        rank_count=len(ranks),
        check=report.check,
        verdict=verdict_for(report, ranks[0]) if ranks else "named",
        step=report.step,
        suspect_window=list(report.suspect_window),
        report_log_group=settings.report_log_group,
        report_log_stream=report.log_stream,
        canary_run=run_id,
    )


__all__ = ["canary_suspect", "suspects_from_reports", "tensor_names", "verdict_for"]
