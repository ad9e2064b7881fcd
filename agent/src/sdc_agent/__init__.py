"""sdc_agent: in-job silent data corruption checks for PyTorch DistributedDataParallel."""

from .alarm import Alarm, RankInfo, Verdict
from .fingerprint import fingerprint, fingerprints
from .publisher import NullPublisher, Publisher
from .schedule import Schedule
from .topology import TopologyError, check_topology, rank_map

__all__ = [
    "Alarm",
    "NullPublisher",
    "Publisher",
    "RankInfo",
    "Schedule",
    "TopologyError",
    "Verdict",
    "check_topology",
    "fingerprint",
    "fingerprints",
    "rank_map",
]
