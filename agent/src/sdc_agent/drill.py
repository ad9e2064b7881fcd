"""``python -m sdc_agent.drill``: run one fire drill (:mod:`sdc_agent.drills.cli`).

The drills live in :mod:`sdc_agent.drills`; the names this module had before they moved there
(the drill job, the launcher) stay importable from here, for code and job paths
(``"sdc_agent.drill:train_drill"``) written against it.
"""

from .drills.cli import main
from .drills.job import (
    DrillModel,
    build,
    build_sharded,
    guarded_sgd,
    make_batch,
    make_fault,
    make_loss,
    make_step_batch,
    train_drill,
)
from .drills.launch import Job, launch, node_name

__all__ = [
    "DrillModel",
    "Job",
    "build",
    "build_sharded",
    "guarded_sgd",
    "launch",
    "main",
    "make_batch",
    "make_fault",
    "make_loss",
    "make_step_batch",
    "node_name",
    "train_drill",
]

if __name__ == "__main__":
    raise SystemExit(main())
