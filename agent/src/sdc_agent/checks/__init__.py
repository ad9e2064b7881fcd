"""The three checks the guard wires around a training step, one package each.

1. :mod:`.gradients`: non-finite gradients, every step.
2. :mod:`.replay`: the ring replay audit, on audit steps, and the confirmation replays.
3. :mod:`.weights`: weight fingerprints compared across replicas, after updates and before
   checkpoints.

What differs between parallel layouts (DDP, FSDP2, HSDP) each check asks the parallelism adapter
(:class:`sdc_agent.parallel.ParallelAdapter`); the online sensors are :mod:`sdc_agent.sensors`.
"""
