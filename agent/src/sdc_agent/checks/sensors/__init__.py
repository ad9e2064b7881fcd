"""Check 4, the online sensors, as a check: :mod:`.check` arms a step's share of the sensors'
rotation, adds their flag to check 1's reduction, and confirms or dismisses a candidate with
check 2's replays. The sensors themselves (the ops, the checksum maths, the board and the plan)
are :mod:`sdc_agent.sensors`."""
