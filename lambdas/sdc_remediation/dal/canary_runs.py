"""Canary runs in the ledger table: ``pk=CANARY#<cluster>, sk=RUN#<run id>``.

Apart from the nodes' items (``pk`` an instance id) and so from the precision ledger: the
canary remediation's own events are under the reserved instance id, which ``logic.outcomes``
leaves out. Only the canary function creates a run; the steps may only append to one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sdc_contract.canary import canary_runs_key

from .. import aws, clock
from ..models.canary import FAILED, STEP_NAMES, Run
from .dynamo import from_item, to_item

RUN_PREFIX = "RUN#"
RUN_RETENTION_SECONDS = 30 * 86400
"""A run's item is removed (the ledger table's TTL, ``expires_at``) this long after it started:
``sdc-remediation canary`` shows the newest runs, not every run ever."""


def run_pk(cluster: str) -> str:
    """Partition key of a cluster's canary runs in the ledger table."""
    return canary_runs_key(cluster)


class RunStore:
    """A cluster's canary runs in the ledger table."""

    def __init__(self, table: str, cluster: str) -> None:
        self.table = table
        self.cluster = cluster

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    def _key(self, run_id: str) -> dict[str, Any]:
        return to_item({"pk": run_pk(self.cluster), "sk": RUN_PREFIX + run_id})

    def start(self, run_id: str, at: datetime, open_seconds: int) -> Run:
        """Record a new run (its first step, ``scheduled``), open for ``open_seconds`` (the
        canary's timeout): after that its report and approval are refused."""
        stamp = clock.iso(at)
        open_until = int(at.timestamp()) + open_seconds
        run = Run(
            run_id=run_id,
            started_at=stamp,
            steps=[{"step": "scheduled", "at": stamp}],
            open_until=open_until,
        )
        item = {
            "pk": run_pk(self.cluster),
            "sk": RUN_PREFIX + run_id,
            "run_id": run_id,
            "started_at": stamp,
            "steps": run.steps,
            "last_step": "scheduled",
            "completed": False,
            "open_until": open_until,
            "expires_at": int(at.timestamp()) + RUN_RETENTION_SECONDS,
        }
        with aws.aws_errors("dynamodb:PutItem"):
            self._ddb.put_item(TableName=self.table, Item=to_item(item))
        return run

    def get(self, run_id: str) -> Run | None:
        """A run by id (None: the ledger has no such run)."""
        with aws.aws_errors("dynamodb:GetItem"):
            resp = self._ddb.get_item(
                TableName=self.table, Key=self._key(run_id), ConsistentRead=True
            )
        item = from_item(resp.get("Item"))
        return Run.from_item(item) if item else None

    def latest(self) -> Run | None:
        """The newest run (None: no canary ever ran)."""
        with aws.aws_errors("dynamodb:Query"):
            resp = self._ddb.query(
                TableName=self.table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :run)",
                ExpressionAttributeValues=to_item(
                    {":pk": run_pk(self.cluster), ":run": RUN_PREFIX}
                ),
                ScanIndexForward=False,
                Limit=1,
                ConsistentRead=True,
            )
        items = resp.get("Items") or []
        return Run.from_item(from_item(items[0]) or {}) if items else None

    def reach(self, run_id: str, step: str, *, error: str | None = None) -> None:
        """Append ``step`` to the run (``completed`` when it is ``closed``)."""
        if step not in STEP_NAMES and step != FAILED:
            raise ValueError(f"unknown canary step {step!r}; expected one of {STEP_NAMES}")
        values: dict[str, Any] = {
            ":step": [{"step": step, "at": clock.iso(clock.now())}],
            ":name": step,
        }
        update = "SET steps = list_append(steps, :step), last_step = :name"
        if step == "closed":
            update += ", completed = :done"
            values[":done"] = True
        # Only a run the canary function recorded: a step never creates one.
        kwargs: dict[str, Any] = {"ConditionExpression": "attribute_exists(pk)"}
        if error is not None:
            update += ", #error = :error"
            values[":error"] = error[:1000]
            kwargs["ExpressionAttributeNames"] = {"#error": "error"}
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=self._key(run_id),
                UpdateExpression=update,
                ExpressionAttributeValues=to_item(values),
                **kwargs,
            )

    def mark_stopped(self, run_id: str, step: str) -> None:
        """Write where the canary alarm found the run stopped."""
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=self._key(run_id),
                UpdateExpression="SET stopped_at = :step",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=to_item({":step": step}),
            )


__all__ = ["RUN_PREFIX", "RunStore", "run_pk"]
