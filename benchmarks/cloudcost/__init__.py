"""What sdc-guard costs to run on AWS, in parts: measured call counts times list prices, per
month. ``benchmarks/cost.py`` is the command that runs it (and docs/cost.md shows its output).

Not to be confused with :mod:`costmodel` beside it, the GPU step-cost model.

One module per concern, in the order the measurement flows:

- :mod:`.prices`: the list-price table, its region and date, the month's hours.
- :mod:`.metering`: how each service meters a request (DynamoDB item sizes and units, log
  bytes, metric series, Step Functions transitions): pure functions.
- :mod:`.counting`: the botocore hook that counts every call by caller.
- :mod:`.agent`: the agent's publisher measured on moto.
- :mod:`.production`: the settings read from the synthesized template.
- :mod:`.stack`: the stack's three scenarios (an alarm, a sweep, a canary run) measured on the
  end-to-end harness.
- :mod:`.monthly`: the assumptions, and the arithmetic from counts to dollars a month.
- :mod:`.report`: the counts in words and the Markdown tables.

Every module imports only the standard library at import time (boto3, moto, the agent and the
harness are imported where a measurement needs them), so ``--load`` prices a saved measurement
without them.
"""
