"""sdc_agent: in-job silent data corruption checks for PyTorch DistributedDataParallel and FSDP2.

import sdc_agent as sdc
guard = sdc.Guard(ddp_model, optimizer, compute_loss=compute_loss,
                  rebuild_batch=rebuild_batch, schedule=sdc.Schedule(audit_every=10))
alarm = guard.train(batches, save_checkpoint=save_checkpoint)

After an alarm, resume only from ``sdc.clean_resume_step(checkpoint_steps, alarm_dir)``
(docs/recovery.md); ``Guard(..., alarm_dir=...)`` records the alarms it reads.

``sdc.faults`` (the fault injectors of fire drills, :mod:`sdc_agent.drills`) is loaded on first
use: importing the agent loads no drill and no fault injector.
"""

import importlib
from types import ModuleType

# _versions first (it sorts first): importing it refuses a torch older than the floor with one
# clear error, before any import below could fail deep inside on a missing torch API.
from . import _versions, sensors  # noqa: F401  (_versions: imported for that check)
from .alarm import Alarm, RankInfo, SensorCandidate, Verdict
from .checks.replay.setup import AuditSetupError
from .checks.weights.divergence import find_divergent_ranks
from .checks.weights.report import DivergenceReport
from .config import (
    AuditConfig,
    GuardConfig,
    ReportConfig,
    SensorsConfig,
    TrainingConfig,
    WeightsConfig,
)
from .errors import SdcAgentError
from .exit import SDC_EXIT_CODE, exit_on_alarm
from .fingerprint import fingerprint, fingerprints
from .guard import Guard, GuardedStep
from .parallel import ShardingLayoutError
from .publisher import NullPublisher, Publisher, SensorFlagPublisher
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
from .sensors import protect
from .topology import TopologyError, check_topology, rank_map

__all__ = [
    "SDC_EXIT_CODE",
    "Alarm",
    "AlarmLogError",
    "AuditConfig",
    "AuditSetupError",
    "DivergenceReport",
    "Guard",
    "GuardConfig",
    "GuardedStep",
    "NullPublisher",
    "Publisher",
    "RankInfo",
    "ReportConfig",
    "ResumeDecision",
    "ResumeRule",
    "Schedule",
    "SdcAgentError",
    "SensorCandidate",
    "SensorFlagPublisher",
    "SensorsConfig",
    "ShardingLayoutError",
    "TopologyError",
    "TrainingConfig",
    "UnsafeResumeError",
    "Verdict",
    "WeightsConfig",
    "check_topology",
    "clean_resume_step",
    "exit_on_alarm",
    "explain_resume",
    "faults",
    "find_divergent_ranks",
    "fingerprint",
    "fingerprints",
    "protect",
    "rank_map",
    "resume_rule",
    "sensors",
]

_LAZY = {"faults": ".faults"}
"""Public names loaded on first use (PEP 562): the drills never ride along with the guard."""


def __getattr__(name: str) -> ModuleType:
    """Load ``sdc_agent.faults`` when it is first asked for."""
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name], __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names, the lazy ones included."""
    return sorted(set(globals()) | set(_LAZY))
