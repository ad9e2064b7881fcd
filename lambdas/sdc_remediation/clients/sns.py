"""SNS: the notifications humans read (what they say is ``logic.notify``'s)."""

from __future__ import annotations

from .. import aws, text


def publish(topic_arn: str, subject: str, message: str) -> str:
    """Publish to the SNS topic; returns the message id. The subject is made one SNS accepts
    whatever it carries (``text.subject``: printable ASCII on one line, under 100 characters):
    a report's text must never be able to make SNS refuse a message."""
    sns = aws.client("sns")
    with aws.aws_errors("sns:Publish"):
        return sns.publish(TopicArn=topic_arn, Subject=text.subject(subject), Message=message)[
            "MessageId"
        ]


__all__ = ["publish"]
