"""Publishing the guard's findings to CloudWatch (boto3: ``pip install "./agent[aws]"`` from a clone).

Importing this package needs no boto3; constructing a CloudWatchPublisher does.
"""

from .cloudwatch import DEFAULT_FLUSH_TIMEOUT, CloudWatchPublisher
from .events import RANKMAP_SCHEMA, Delivery
from .lifecycle import close_all
from .settings import PublishConfigError, PublishSettings, RetryPolicy
from .spool import Spool

__all__ = [
    "DEFAULT_FLUSH_TIMEOUT",
    "RANKMAP_SCHEMA",
    "CloudWatchPublisher",
    "Delivery",
    "PublishConfigError",
    "PublishSettings",
    "RetryPolicy",
    "Spool",
    "close_all",
]
