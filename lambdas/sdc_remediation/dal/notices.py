"""What is said once: one message per alarm episode (``keys.notice``) and one reminder per
period (``keys.due``), claimed in the ledger table so that concurrent executions agree."""

from __future__ import annotations

from .. import clock
from . import keys
from .dynamo import Table

_NOTICE_TTL_SECONDS = 86400
"""An episode's item expires this long after the episode's quiet period ended."""


class Notices:
    """Episode and reminder claims of the ledger table."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def first_in_episode(
        self, cluster: str, episode: str, transition: str, quiet_seconds: int
    ) -> bool:
        """Whether this ``transition`` of ``episode`` (an alarm contributor) is the first of
        its episode: True when none was recorded within the last ``quiet_seconds``.

        Every call extends the episode (the same item, its ``until`` moved on), so an alarm
        that flaps every 20 s is one episode and one message for as long as it flaps; one that
        stays quiet for ``quiet_seconds`` starts a new one. The item expires a day after.
        """
        now = int(clock.now().timestamp())
        until = now + quiet_seconds
        previous = self._table.update(
            keys.notice(cluster, episode, transition),
            "SET #until = :until, expires_at = :expires, last_at = :at ADD occurrences :one",
            names={"#until": "until"},
            values={
                ":until": until,
                ":expires": until + _NOTICE_TTL_SECONDS,
                ":at": clock.iso(clock.now()),
                ":one": 1,
            },
            # The whole item as it was: an attribute set to the value it already had is
            # not "updated", so UPDATED_OLD may leave `until` out.
            ReturnValues="ALL_OLD",
        )
        return int((previous or {}).get("until", 0)) < now

    def due(self, cluster: str, what: str, every_seconds: int) -> bool:
        """Claim the ``what`` that is due once every ``every_seconds`` (a reminder): True for
        the first caller after the period ended, False for everyone until the next one."""
        now = int(clock.now().timestamp())
        return self._table.update_if(
            keys.due(cluster, what),
            "SET next_at = :next, last_at = :at",
            "attribute_not_exists(next_at) OR next_at <= :now",
            values={":next": now + every_seconds, ":now": now, ":at": clock.iso(clock.now())},
        )

    def release_due(self, cluster: str, what: str) -> None:
        """Give back the claim :meth:`due` took (its message could not be sent), so that the
        next caller claims it again instead of waiting for the next period. Safe against a
        concurrent caller: nobody else can have claimed it within the period just claimed."""
        self._table.delete_if(keys.due(cluster, what), "attribute_exists(next_at)")


__all__ = ["Notices"]
