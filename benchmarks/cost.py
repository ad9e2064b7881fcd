"""What sdc-guard costs to run on AWS: measured call counts times list prices, per month.

    python benchmarks/cost.py [--json [PATH]] [--nodes 64,512,2048] [--nodes-per-job 64]
                              [--gpus-per-node 8] [--health-check-minutes 120]
                              [--lambda-seconds 1] [--ledger-months 12]
                              [--liveness-interval S] [--cluster-nodes 6] [--skip-pipeline]
    python benchmarks/cost.py --load PATH [...]   # price a saved --json measurement again

Two measurements, then arithmetic:

1. The agent's publisher (``sdc_agent.publish.CloudWatchPublisher``, as DP rank 0 of a job runs
   it) against an in-process moto: one rank map, a liveness batch, one alarm naming one node.
   Every AWS call is counted by a botocore ``before-call`` hook on its clients: PutMetricData
   calls, datapoints and the distinct series (namespace, metric, dimensions), PutLogEvents calls
   and bytes.
2. The remediation stack on the end-to-end harness (tests/e2e/harness: the template ``cdk synth``
   produces, the real state machine definition and Lambda handlers on moto): one alarm taken
   from the agent's publish to a replaced node, one sweeper run, one canary run. Every client
   made while it runs gets the same hook; a call is attributed to the function whose handler
   made it (the runtime's invocation thread), and calls made by the harness itself (the alarm
   evaluator standing in for CloudWatch, the test's polling) are reported apart and not priced.
   State transitions come from the execution history, Lambda invocations from the runtime,
   DynamoDB capacity units from the sizes of the items read and written, the functions' logs
   and Powertools EMF metrics from what they print.

Schedules, the health-check poll interval, Lambda memory and architecture, alarms and their
metrics are read from the template synthesized with the project's own cdk.json context; the
liveness interval from ``PublishSettings``. ``--skip-pipeline`` measures the agent only (no
synth, no Node.js); ``--load`` prices a measurement saved with ``--json PATH`` under other
assumptions without measuring again. The prices are a table (PRICES in
benchmarks/cloudcost/prices.py), with their region and the date they were written down;
docs/cost.md shows the output and what it assumes.

This file is the command line only; the work is done by the package benchmarks/cloudcost (its
docstring maps the modules: prices, metering, counting, the agent's and the stack's measurement,
the monthly arithmetic, the report).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# The package is imported from the repository root, which only the lines above put on the path
# when this file runs as a script or is loaded by its path (as the tests do): hence E402.
from benchmarks.cloudcost.agent import measure_agent  # noqa: E402
from benchmarks.cloudcost.counting import CallCounter, diff, register_table_keys  # noqa: E402
from benchmarks.cloudcost.metering import dynamo_item_size, read_units, transitions_of, write_units  # noqa: E402
from benchmarks.cloudcost.monthly import Assumptions, monthly, poll_extrapolation  # noqa: E402
from benchmarks.cloudcost.prices import PRICES, PRICES_DATE, PRICES_REGION  # noqa: E402
from benchmarks.cloudcost.report import render, summary  # noqa: E402
from benchmarks.cloudcost.stack import measure_stack  # noqa: E402

__all__ = [
    # What tests/unit/test_cost_model.py and tests/e2e/test_cost_measurement.py use of the
    # package, through this file (they load it by path).
    "Assumptions",
    "CallCounter",
    "diff",
    "dynamo_item_size",
    "main",
    "measure_agent",
    "measure_stack",
    "monthly",
    "poll_extrapolation",
    "read_units",
    "register_table_keys",
    "transitions_of",
    "write_units",
]


def main(argv: list[str] | None = None) -> int:
    """Measure, then print the counts and the monthly cost tables (or JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="the counts and costs as JSON: printed, or written to PATH",
    )
    parser.add_argument("--nodes", default="64,512,2048", help="cluster sizes, comma-separated")
    parser.add_argument("--nodes-per-job", type=int, default=Assumptions.nodes_per_job)
    parser.add_argument("--gpus-per-node", type=int, default=Assumptions.gpus_per_node)
    parser.add_argument(
        "--health-check-minutes", type=float, default=Assumptions.health_check_minutes
    )
    parser.add_argument(
        "--lambda-seconds",
        type=float,
        default=Assumptions.lambda_seconds,
        help="billed seconds per Lambda invocation at least",
    )
    parser.add_argument(
        "--cluster-nodes", type=int, default=6, help="nodes of the harness's simulated cluster"
    )
    parser.add_argument(
        "--ledger-months",
        type=float,
        default=Assumptions.ledger_months,
        help="months of remediation history in the ledger the sweeper scans",
    )
    parser.add_argument(
        "--liveness-interval",
        type=float,
        help="price the agents as if CloudWatchPublisher(liveness_interval=...) were set "
        "(seconds; default: PublishSettings' default)",
    )
    parser.add_argument(
        "--load",
        metavar="JSON",
        help="price the measurement an earlier --json run wrote, instead of measuring",
    )
    parser.add_argument(
        "--skip-pipeline", action="store_true", help="measure the agent only (no synth, no harness)"
    )
    args = parser.parse_args(argv)
    nodes = [int(n) for n in args.nodes.split(",")]
    a = Assumptions(
        nodes_per_job=args.nodes_per_job,
        gpus_per_node=args.gpus_per_node,
        health_check_minutes=args.health_check_minutes,
        lambda_seconds=args.lambda_seconds,
        ledger_months=args.ledger_months,
    )
    os.environ.setdefault("AWS_DEFAULT_REGION", PRICES_REGION)
    if args.load:
        # Price an earlier measurement (what --json printed) again, e.g. with other assumptions.
        measured = json.loads(Path(args.load).read_text())["measured"]
    else:
        measured = {
            "run": {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "command": " ".join(["python", "benchmarks/cost.py", *(argv or sys.argv[1:])]),
                "machine": f"{os.cpu_count()} CPUs, load average "
                + " ".join(f"{x:.1f}" for x in os.getloadavg()),
                "python": sys.version.split()[0],
            },
            "agent": measure_agent(
                ranks_per_job=a.nodes_per_job * a.gpus_per_node, gpus_per_node=a.gpus_per_node
            ),
        }
        if not args.skip_pipeline:
            measured["stack"] = measure_stack(cluster_nodes=args.cluster_nodes)
    if args.liveness_interval:
        measured["agent"]["liveness_interval_s"] = args.liveness_interval
    if args.json:
        costs = {
            str(n): {
                "idle": monthly(
                    measured["agent"], measured.get("stack"), nodes=n, alarms_per_day=0, a=a
                ),
                "one_alarm_a_day": monthly(
                    measured["agent"], measured.get("stack"), nodes=n, alarms_per_day=1, a=a
                ),
            }
            for n in nodes
        }
        text = json.dumps(
            {
                "prices": {"region": PRICES_REGION, "date": PRICES_DATE, **PRICES},
                "assumptions": dataclasses.asdict(a),
                "measured": measured,
                "monthly_usd": costs,
            },
            indent=1,
            default=str,
        )
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    else:
        print(summary(measured, a))
        print()
        print(render(measured, nodes, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
