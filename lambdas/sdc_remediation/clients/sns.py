"""SNS: the notifications humans read (what they say is ``logic.notify``'s)."""

from __future__ import annotations

from .. import aws


def publish(topic_arn: str, subject: str, message: str) -> str:
    """Publish to the SNS topic; returns the message id."""
    sns = aws.client("sns")
    with aws.aws_errors("sns:Publish"):
        return sns.publish(TopicArn=topic_arn, Subject=subject, Message=message)["MessageId"]


__all__ = ["publish"]
