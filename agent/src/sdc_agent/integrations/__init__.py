"""sdc-guard inside the training loops people already run (docs/integrations.md).

One module per framework, each an optional extra that imports its framework only when the
module itself is imported (importing ``sdc_agent`` or ``sdc_agent.integrations`` imports none):

- :mod:`sdc_agent.integrations.accelerate` (``pip install "./agent[accelerate]"`` from a clone):
  :class:`~sdc_agent.integrations.accelerate.AcceleratorGuard`, around
  ``accelerator.accumulate``, ``accelerator.backward`` and the optimizer step;
- :mod:`sdc_agent.integrations.lightning` (``[lightning]``):
  :class:`~sdc_agent.integrations.lightning.SDCGuardCallback`, a PyTorch Lightning callback
  for its DDP strategy and its FSDP2 ``ModelParallelStrategy``;
- :mod:`sdc_agent.integrations.transformers` (``[transformers]``):
  :class:`~sdc_agent.integrations.transformers.GuardedTrainer`, the Hugging Face ``Trainer``
  with a ``TrainerCallback`` and the few overrides a callback cannot do;
- :mod:`sdc_agent.integrations.torchtitan` (``[torchtitan]``):
  :class:`~sdc_agent.integrations.torchtitan.TitanGuard`, torchtitan's model, FSDP2
  parallelization, optimizer, loss and checkpointer in the guard's loop.

What they share is here: :class:`StepHooks` (the step API driven from hooks, for a framework not
covered yet), :class:`AlarmStop` (how an integration stops a framework's loop on an alarm) and
the checkpoint tags file.
"""

from .hooks import TAGS_FILE, AlarmStop, OnAlarm, StepHooks, read_tags, write_tags

__all__ = ["TAGS_FILE", "AlarmStop", "OnAlarm", "StepHooks", "read_tags", "write_tags"]
