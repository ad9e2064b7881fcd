"""What every sensor shares at run time: the board, the plan, the taps and the coverage text.

:mod:`.board` keeps each sensor's threshold and device flag (no host sync on a check);
:mod:`.plan` decides, the same on every rank, which sensors check on which step within the
budget; :mod:`.tap` lets a drill reach a checked value; :mod:`.families` says per op family what
is checked, for ``Guard.coverage()``. Nothing here knows an op: the op sensors
(:mod:`sdc_agent.sensors.ops`) build on it.
"""
