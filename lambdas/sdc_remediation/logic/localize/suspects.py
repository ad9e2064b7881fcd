"""From reports to suspects: one per instance any report names, with the evidence that names it,
bounded (``models.state``: at most ``MAX_RANKS_PER_SUSPECT`` ranks and ``MAX_TENSOR_NAMES``
tensor names, and where the full report is in CloudWatch Logs).

Every claim is checked on its own: a report naming a node it cannot be trusted about (a node of
another job, an instance HyperPod does not have, a pod on another node) loses that node only,
as a ``Refusal``; its other nodes, and every other report, go on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import sdc_contract as contract
from sdc_contract.names import is_subdomain_name
from sdc_contract.report import verdict_name

from ... import clock
from ...clients.kube import KubeApi
from ...config import Settings
from ...errors import InstanceNotInCluster, NodeNotFound, UntrustedReport
from ...models import Alarm, RankInfo, Refusal, Report, Suspect
from ...models.state import MAX_RANKS_PER_SUSPECT, MAX_TENSOR_NAME_CHARS, MAX_TENSOR_NAMES
from . import canary, idle
from .evidence import refusal
from .resolve import RankResolver

REFUSED_CLAIMS = (UntrustedReport, InstanceNotInCluster, NodeNotFound)
"""What makes localize refuse one claim of a report (and go on with the rest)."""


@dataclass
class Resolution:
    """The suspects the reports name, the claims refused, and the nodes the reports mention."""

    suspects: list[Suspect] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    mentioned: set[str] = field(default_factory=set)
    """Nodes a report places a rank on, blamed or not (a node it mentions is explained)."""


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
    reports: list[Report], settings: Settings, kube: Callable[[], KubeApi], alarm: Alarm
) -> Resolution:
    """One suspect per instance named by any report (the newest report's evidence wins; the
    ranks of every report naming the instance are merged). Each node must be corroborated:
    a pod of the report's job ran on it (``RankResolver.corroborate``); a claim that does not
    hold is refused alone."""
    resolver = RankResolver(settings, kube)
    since = clock.parse_iso(alarm.window_start)
    by_instance: dict[str, Suspect] = {}
    out = Resolution()
    for report in reports:  # oldest first, so later reports overwrite the evidence
        stream = report.log_stream
        out.mentioned.update(info.node_name for info in report.ranks.values() if info.node_name)
        if report.job == contract.CANARY_JOB or report.canary_run is not None:
            try:
                suspect = canary_suspect(report, settings)
            except UntrustedReport as exc:
                out.refused.append(refusal(exc, stream=stream, job=report.job))
                continue
            by_instance[suspect.instance_id] = suspect
            continue
        # The idle screener's report: its ledger record of the screen stands in for the pod
        # of the job that corroborates a training report (the screen ran on no job's pod).
        screened = report.job == contract.IDLE_SCREEN_JOB
        try:
            if screened:
                idle.verify_report(report, settings)
            resolver.verify_writer(report)
            canary.refuse_reserved_node(report)
            refuse_setup(report)
        except UntrustedReport as exc:
            out.refused.append(refusal(exc, stream=stream, job=report.job))
            continue
        for rank in sorted(set(report.suspects or [])):
            node_hint: str | None = None
            try:
                info = resolver.rank_info(report, rank)
                node_hint = info.node_name
                node, instance_id = resolver.verified_node(info, rank, report.job)
                node_hint = node
                group = resolver.instance_group(instance_id)
                if not screened:
                    resolver.corroborate(report.job, node, since)
            except REFUSED_CLAIMS as exc:
                out.refused.append(
                    refusal(exc, stream=stream, job=report.job, node=_node_name(node_hint))
                )
                continue
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
                verdict=verdict_name(verdict_for(report, rank)),
                step=report.step,
                suspect_window=list(report.suspect_window),
                last_audit_pass=report.last_audit_pass,
                last_weight_check_pass=report.last_weight_check_pass,
                divergent_tensors=tensor_names(report),
                divergent_tensor_count=len(report.divergent_tensors),
                nonfinite_count=len(report.nonfinite),
                report_log_group=settings.report_log_group,
                report_log_stream=report.log_stream,
                report_time=clock.iso(report.time),
            )
    out.suspects = sorted(by_instance.values(), key=lambda s: s.node_name)
    return out


def refuse_setup(report: Report) -> None:
    """Refuse a report whose verdicts say the job's set-up, not a GPU, is at fault
    (``sdc_contract.report.SETUP_VERDICT``: a rebuilt batch that differs from the trained one,
    a failed preflight, more mismatches than one GPU explains). The agent names nobody in such
    a report; one that names a node anyway is refused whole, like a reproducible finding,
    rather than cordon a healthy node for a user's mistake."""
    if any(v.kind == contract.SETUP_VERDICT for v in report.verdicts):
        raise UntrustedReport(
            f"the report of step {report.step} is a set-up finding (verdict "
            f"'{contract.SETUP_VERDICT}'): the job's rebuild_batch, compute_loss or kernels, "
            "not a GPU; it names no node to remediate"
        )


def _node_name(value: str | None) -> str | None:
    """A node name fit to carry in a refusal (a well-formed one; None otherwise)."""
    return value if value and is_subdomain_name(value) else None


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
        verdict=verdict_name(verdict_for(report, ranks[0])) if ranks else "named",
        step=report.step,
        suspect_window=list(report.suspect_window),
        report_log_group=settings.report_log_group,
        report_log_stream=report.log_stream,
        report_time=clock.iso(report.time),
        canary_run=run_id,
    )


__all__ = [
    "REFUSED_CLAIMS",
    "Resolution",
    "canary_suspect",
    "refuse_setup",
    "suspects_from_reports",
    "tensor_names",
    "verdict_for",
]
