"""The printout: the measured counts in words, and the Markdown tables docs/cost.md shows.

Only formatting; every figure comes from :mod:`.monthly`.
"""

from __future__ import annotations

import math
from typing import Any

from .monthly import Assumptions, monthly, poll_extrapolation, total
from .prices import PRICES_DATE, PRICES_REGION


def render(measured: dict[str, Any], nodes: list[int], a: Assumptions) -> str:
    """The tables docs/cost.md shows (Markdown)."""
    agent, stack = measured["agent"], measured.get("stack")
    lines = [
        f"Prices: {PRICES_REGION} list prices as known on {PRICES_DATE}, not fetched; "
        "no free tier subtracted.",
        f"Assumptions: {a.nodes_per_job} nodes per job, {a.gpus_per_node} GPUs per node, "
        f"{a.job_starts_per_day:g} job start(s) a day, a {a.health_check_minutes:g}-minute deep "
        f"health check, {a.email_subscribers} email subscriber(s), at least "
        f"{a.lambda_seconds:g} s billed per Lambda invocation.",
        "",
        "| nodes | jobs | agents, idle | stack, idle | total, idle | agents, 1 alarm/day "
        "| stack, 1 alarm/day | total, 1 alarm/day |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    scenarios = {}
    for n in nodes:
        idle = monthly(agent, stack, nodes=n, alarms_per_day=0, a=a)
        busy = monthly(agent, stack, nodes=n, alarms_per_day=1, a=a)
        scenarios[n] = (idle, busy)
        row = [f"{n:,}", f"{math.ceil(n / a.nodes_per_job)}"]
        for parts in (idle, busy):
            row += [
                f"${sum(parts['agents'].values()):,.2f}",
                f"${sum(parts.get('stack', {}).values()):,.2f}" if stack else "n/a",
                f"${total(parts):,.2f}",
            ]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Per service, $ a month (agents + stack):", ""]
    header = "| service | " + " | ".join(f"{n:,} idle | {n:,} 1/day" for n in nodes) + " |"
    lines += [header, "|---|" + "---:|" * (2 * len(nodes))]
    services = list(next(iter(scenarios.values()))[0]["agents"])
    for service in services:
        cells = []
        for n in nodes:
            for parts in scenarios[n]:
                cells.append(f"{sum(p.get(service, 0.0) for p in parts.values()):,.4f}")
        lines.append(f"| {service} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(measured: dict[str, Any], a: Assumptions) -> str:
    """The measured counts, in words."""
    agent = measured["agent"]
    live, alarm, rmap = agent["liveness"], agent["alarm"], agent["rank_map"]
    out = [
        "Agent (one job's DP rank 0, moto):",
        f"  liveness: {live['operations'].get('cloudwatch:PutMetricData', 0)} PutMetricData in "
        f"{live['intervals']} intervals of {live['steps']} steps ({live['sends_per_interval']} "
        f"per interval; default interval {agent['liveness_interval_s']:g} s), "
        f"{live['datapoints_per_send']:g} datapoints each, series {live['series']}",
        f"  rank map of {agent['ranks']} ranks: {rmap['operations']} "
        f"{rmap['log_bytes']:,} bytes ({agent['rank_map_bytes_per_rank']:.0f} per rank)",
        f"  one alarm naming one node: {alarm['operations']}, {alarm['put_metric_data_datapoints']} "
        f"datapoints, {alarm['log_bytes']:,} log bytes, series {alarm['series']}",
    ]
    stack = measured.get("stack")
    if stack:
        prod = stack["production"]
        extra = poll_extrapolation(stack, a)
        out += [
            f"Stack (harness, {stack['cluster_nodes']} nodes; template from cdk.json's context):",
            f"  schedules (s): {prod['schedules_s']}; health-check poll every "
            f"{prod['health_check_poll_s']} s; memory (MB): {prod['memory_mb']}; "
            f"{prod['architectures']}; log retention {prod['log_retention_days']} days",
            f"  alarms: {[(x['name'], x['metrics'], x['period']) for x in prod['alarms']]}; "
            f"dashboards {prod['dashboards']}; KMS keys {prod['kms_keys']}",
        ]
        for name in ("alarm", "sweep", "canary"):
            p = stack[name]
            out.append(
                f"  per {name}: {p['transitions']} transitions, {p['invocations']} invocations "
                f"({p['lambda_gb_seconds']} GB-s), {p['lambda_log_bytes']:,} function log bytes, "
                f"{p['state_log_bytes']:,} state-machine log bytes, DynamoDB {p['ddb_wru']} WRU "
                f"{p['ddb_rru']} RRU, SNS {p['sns_publishes']}, GetMetricData metrics "
                f"{p['get_metric_data_metrics']}, EMF series {len(p['emf_series'])}, "
                f"PutMetricData series {len(p['put_metric_data_series'])}"
            )
            out.append(f"    calls: {p['operations']}")
            out.append(
                "    invocations: "
                + ", ".join(f"{k} x{v['invocations']}" for k, v in p["functions"].items())
            )
        out.append(
            f"  health check: {extra['measured_polls']} polls measured, {extra['real_polls']} "
            f"for a {a.health_check_minutes:g}-minute check: +{extra['transitions']} transitions "
            f"({stack['poll_loop_transitions']} per poll), +{extra['invocations']} invocations"
        )
    return "\n".join(out)
