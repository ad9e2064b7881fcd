"""Messages sent at most once per period (the sweeper's reminders and flood notices).

The period is claimed in the ledger before the message is published, so two concurrent sweeps
send one message. When SNS refuses the message (throttled, its key disabled, unreachable) the
claim is given back, so the next sweep, 15 minutes later, tries again instead of staying silent
for the rest of the period; the refusal is raised for the caller to log and count.
"""

from __future__ import annotations

from ..clients import sns
from ..dal.ledger import Ledger


def publish_when_due(
    ledger: Ledger,
    cluster: str,
    what: str,
    every_seconds: int,
    *,
    topic_arn: str,
    subject: str,
    message: str,
) -> bool:
    """Publish ``subject``/``message`` if the period of ``what`` is due (claiming it): True
    when sent, False when not due. Raises what SNS raised, after giving the claim back."""
    if not ledger.due(cluster, what, every_seconds):
        return False
    try:
        sns.publish(topic_arn, subject, message)
    except BaseException:
        ledger.release_due(cluster, what)
        raise
    return True


__all__ = ["publish_when_due"]
