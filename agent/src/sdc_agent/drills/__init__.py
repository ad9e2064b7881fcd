"""Fire drills and fault injectors: prove on a live job that the checks catch what they claim.

Nothing the guard runs imports this package (a test keeps it so): :mod:`.faults` are the fault
injectors (also reachable as ``sdc_agent.faults``, loaded on first use), :mod:`.job` the drill
job every rank runs, :mod:`.sharded` its FSDP2/HSDP model, :mod:`.checkpoints` its run
directory and restart, :mod:`.launch` the multi-process launcher (the tests use it too);
``python -m sdc_agent.drill`` (:mod:`sdc_agent.drill`) runs one drill.
"""
