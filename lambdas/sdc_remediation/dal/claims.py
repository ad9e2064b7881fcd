"""Report claims: one remediation per report. The item ``keys.report(instance id, report)`` says
which remediation (execution, Map item) took a report of a node; an admission writes it in its
transaction (``claim_op``), a shadowed alarm on its own (``claim``), and a remediation that
failed before anyone decided gives it back (``release``)."""

from __future__ import annotations

from typing import Any

from .. import clock
from ..models.admission import AdmitRequest
from . import keys
from .dynamo import Table

_NEW = "attribute_not_exists(pk)"


class ReportClaims:
    """The report claims of the ledger table."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, req: AdmitRequest) -> dict[str, Any] | None:
        """The remediation that already took ``req``'s report on this node, if any."""
        if not req.report:
            return None
        return self._table.get(keys.report(req.instance_id, req.report))

    def taken(self, instance_id: str, report: str) -> dict[str, Any] | None:
        """The claim of ``report`` on the node ``instance_id``, if any (the sweeper's
        backstop, which knows the report and its nodes, not an admission request)."""
        return self._table.get(keys.report(instance_id, report))

    def claim(self, req: AdmitRequest, remediation_id: str) -> dict[str, Any] | None:
        """Claim ``req``'s report for ``remediation_id`` outside an admission (a shadowed
        alarm, which claims nothing else): None when claimed now (or by this very execution and
        item before: a retry), else the claim that took it first."""
        if not req.report:
            return None
        if self._table.put_if(_item(req, remediation_id), _NEW):
            return None
        claimed = self.get(req) or {}
        mine = claimed.get("execution") == req.execution and (
            claimed.get("item") is None or req.item is None or claimed["item"] == req.item
        )
        return None if mine else claimed

    def claim_op(self, req: AdmitRequest, remediation_id: str) -> dict[str, Any]:
        """The admission transaction's claim of ``req``'s report: one remediation per report,
        so a second admission of the same report loses here and re-reads it as a duplicate."""
        return self._table.put_op(_item(req, remediation_id), condition=_NEW)

    def release(self, instance_id: str, report: str, remediation_id: str) -> None:
        """Give the report back after its remediation failed before anyone decided (cordon or
        the health check could not run): the same evidence may be remediated again. Only the
        claim ``remediation_id`` holds is removed."""
        self._table.delete_if(
            keys.report(instance_id, report),
            "remediation_id = :rid",
            values={":rid": remediation_id},
        )


def _item(req: AdmitRequest, remediation_id: str) -> dict[str, Any]:
    item = {
        **keys.report(req.instance_id, req.report or "-"),
        "remediation_id": remediation_id,
        "execution": req.execution,
        "item": req.item,
        "at": clock.iso(clock.now()),
    }
    return {k: v for k, v in item.items() if v is not None}


__all__ = ["ReportClaims"]
