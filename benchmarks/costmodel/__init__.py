"""A GPU cost model that runs on a CPU: what the guard adds to a training step, counted at the
dispatch level on shape-faithful slices (:mod:`.recorder`), and projected onto full models on an
H100 and an H200 with stated constants (:mod:`.project`). ``benchmarks/step_cost.py`` runs it.

It is a MODEL, not a measurement: no GPU runs here. The counts (bytes, FLOPs, launches, host
syncs, collectives, live memory) are exact for what ran on the CPU; the GPU times are those
counts times the constants of :mod:`.project`.
"""
