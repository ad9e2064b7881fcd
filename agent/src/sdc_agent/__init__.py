"""sdc_agent: in-job silent data corruption checks for PyTorch DistributedDataParallel.

import sdc_agent as sdc
guard = sdc.Guard(ddp_model, optimizer, compute_loss=compute_loss,
                  rebuild_batch=rebuild_batch, schedule=sdc.Schedule(audit_every=10))
alarm = guard.train(batches, save_checkpoint=save_checkpoint)

After an alarm, resume only from ``sdc.clean_resume_step(checkpoint_steps, alarm_dir)``
(docs/recovery.md); ``Guard(..., alarm_dir=...)`` records the alarms it reads.
"""

from . import faults
from .alarm import Alarm, RankInfo, Verdict
from .divergence import DivergenceReport, find_divergent_ranks
from .exit import SDC_EXIT_CODE, exit_on_alarm
from .fingerprint import fingerprint, fingerprints
from .guard import Guard, GuardedStep
from .publisher import NullPublisher, Publisher
from .recovery import (
    AlarmLogError,
    ResumeDecision,
    ResumeRule,
    UnsafeResumeError,
    clean_resume_step,
    explain_resume,
    resume_rule,
)
from .schedule import Schedule
from .topology import TopologyError, check_topology, rank_map

__all__ = [
    "SDC_EXIT_CODE",
    "Alarm",
    "AlarmLogError",
    "DivergenceReport",
    "Guard",
    "GuardedStep",
    "NullPublisher",
    "Publisher",
    "RankInfo",
    "ResumeDecision",
    "ResumeRule",
    "Schedule",
    "TopologyError",
    "UnsafeResumeError",
    "Verdict",
    "check_topology",
    "clean_resume_step",
    "exit_on_alarm",
    "explain_resume",
    "faults",
    "find_divergent_ranks",
    "fingerprint",
    "fingerprints",
    "rank_map",
    "resume_rule",
]
