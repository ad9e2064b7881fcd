"""The four checks the guard wires around a training step, one package each.

1. :mod:`.gradients`: non-finite gradients, every step.
2. :mod:`.replay`: the ring replay audit, on audit steps, and the confirmation replays.
3. :mod:`.weights`: weight fingerprints compared across replicas, after updates and before
   checkpoints.
4. :mod:`.sensors`: the online sensors of protected layers (their kernels are
   :mod:`sdc_agent.sensors`), whose flag travels in check 1's reduction and whose candidates
   check 2's replays confirm.

Each is a :class:`.protocol.Check`, the one protocol the coordinator drives them through
(seeding, begin and end of a step, a flag for the step's reduction, whether the step is decided
at once, its coverage). What differs between parallel layouts (DDP, FSDP2, HSDP, TP, pipelines)
each check asks the parallelism adapter (:class:`sdc_agent.parallel.ParallelAdapter`).
"""
