"""The operator CLI: ``sdc-remediation pending | approve | reject | release | history | stats``.

Decisions and releases go to the approve function's URL (``--approval-url`` /
``SDC_APPROVAL_URL``, the stack output ``ApprovalUrl``), SigV4-signed with your credentials: the
function records the IAM identity AWS authenticated, and it alone can resume the workflow.
Without a URL the CLI works on the tables directly (``approvals`` and ``ledger``) as your own
identity, which needs permissions the operator policy does not grant (task results, task
tokens): that path is for administrators and local stand-ins. ``history`` always reads the
ledger. Every domain error ends with one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import click

from .. import aws, clock, text
from ..clients.approval_url import ApprovalService
from ..clients.kube import KubeApi
from ..clients.screener import screen_node
from ..config import Settings
from ..dal.approvals import Approvals, caller_arn
from ..dal.canary_runs import RunStore
from ..dal.ledger import Ledger
from ..errors import ConfigurationError, NoCredentials, RemediationError
from ..logic import outcomes
from ..logic import release as release_logic
from ..logic import stats as precision
from .tables import canary_table, remediations_table, stats_table

LINE_CHARS = 2000


def _failure(message: str) -> click.ClickException:
    """A one-line error (``Error: <message>``, exit 1), printable: an error's text may carry
    what someone else wrote (a node name or reason the approve function echoes, AWS's text)."""
    return click.ClickException(text.printable(message, LINE_CHARS))


def _fail_cleanly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn domain and AWS errors into ``Error: <one line>`` and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigurationError as exc:
            error: RemediationError = exc
            if isinstance(exc.__cause__, botocore.exceptions.NoCredentialsError):
                error = NoCredentials(
                    "no AWS credentials found (configure a profile, SSO login or AWS_* variables)"
                )
            raise _failure(f"{type(error).__name__}: {error}") from None
        except RemediationError as exc:
            raise _failure(f"{type(exc).__name__}: {exc}") from None
        except botocore.exceptions.NoRegionError:
            raise _failure("NoRegion: pass --region or set AWS_REGION") from None
        except botocore.exceptions.NoCredentialsError:
            raise _failure("NoCredentials: no AWS credentials found") from None
        except botocore.exceptions.ClientError as exc:
            raise _failure(f"{exc.response.get('Error', {}).get('Code', 'AWS')}: {exc}") from None
        except botocore.exceptions.BotoCoreError as exc:
            raise _failure(f"{type(exc).__name__}: {exc}") from None

    return wrapper


def _say(line: str) -> None:
    """Print one line built from stored data: printable, no escape sequence reaches the
    terminal (a report's or a request's text could hold one). ``--json`` prints JSON, which
    escapes control characters itself."""
    click.echo(text.printable(line, LINE_CHARS))


def _approvals(ctx: click.Context) -> Approvals:
    table = ctx.obj["approvals_table"]
    if not table:
        raise ConfigurationError(
            "the approvals table is unknown: pass --approvals-table or set SDC_APPROVALS_TABLE"
        )
    return Approvals(table)


def _ledger(ctx: click.Context) -> Ledger:
    table = ctx.obj["ledger_table"]
    if not table:
        raise ConfigurationError(
            "the ledger table is unknown: pass --ledger-table or set SDC_LEDGER_TABLE"
        )
    return Ledger(table)


@click.group()
@click.option(
    "--approvals-table",
    envvar="SDC_APPROVALS_TABLE",
    help="DynamoDB approvals table (env SDC_APPROVALS_TABLE).",
)
@click.option(
    "--ledger-table",
    envvar="SDC_LEDGER_TABLE",
    help="DynamoDB ledger table (env SDC_LEDGER_TABLE).",
)
@click.option(
    "--approval-url",
    envvar="SDC_APPROVAL_URL",
    help="The approve function's URL (stack output ApprovalUrl; env SDC_APPROVAL_URL).",
)
@click.option("--region", help="AWS region (default: your AWS configuration).")
@click.pass_context
def main(
    ctx: click.Context,
    approvals_table: str | None,
    ledger_table: str | None,
    region: str | None,
    approval_url: str | None = None,
) -> None:
    """Review and decide sdc-guard remediations (approvals wait 24 h by default)."""
    # The region goes to the clients this command makes, never into os.environ (shared by
    # every thread of the process, and read by whoever runs the CLI in-process).
    ctx.with_resource(aws.region(region))
    ctx.obj = {
        "approvals_table": approvals_table,
        "ledger_table": ledger_table,
        "approval_url": approval_url,
        "region": region,
    }


def _service(ctx: click.Context) -> ApprovalService | None:
    """The approve function's client when a URL is configured (None: the direct path)."""
    url = ctx.obj.get("approval_url")
    return ApprovalService(url, region=ctx.obj.get("region")) if url else None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the requests as JSON.")
@click.pass_context
@_fail_cleanly
def pending(ctx: click.Context, as_json: bool) -> None:
    """List approval requests waiting for a decision, with their evidence (and decisions whose
    sending had an unknown outcome)."""
    service = _service(ctx)
    items = service.call("pending")["pending"] if service else _approvals(ctx).pending()
    if as_json:
        click.echo(json.dumps(items, indent=2, default=str))
        return
    if not items:
        click.echo("No pending approvals.")
        return
    for item in items:
        ev = item["evidence"]
        health = (ev.get("health_check") or {}).get("status", "not run")
        screen = (ev.get("screen") or {}).get("status", "not run")
        _say(
            f"{item['approval_id']}  {item['node_name']} ({item['instance_id']})  "
            f"check={ev.get('check')} step={ev.get('step')} verdict={ev.get('verdict')} "
            f"window={ev.get('suspect_window')} health={health} screen={screen} "
            f"earlier={len(ev.get('previous_remediations', []))}  requested {item['created_at']}"
        )
        if ev.get("resume"):
            _say(f"    resume rule: {ev['resume'].get('sentence')}")
        if ev.get("screen"):
            _say(f"    screen: {ev['screen'].get('line')}")
        _say(f"    suggested: {ev.get('suggested_action', '')}")
        if item.get("status") == "sending":
            _say(
                f"    {item.get('decision')} by {item.get('approver')} at {item.get('decided_at')} "
                f"was sent but its outcome is unknown: repeat `{item.get('decision')}` to re-send it"
            )


@main.command()
@click.argument("approval_id")
@click.option("--reason", default="", help="Why (recorded in the ledger and the workflow).")
@click.pass_context
@_fail_cleanly
def approve(ctx: click.Context, approval_id: str, reason: str) -> None:
    """Approve replacing the node of APPROVAL_ID."""
    service = _service(ctx)
    if service:
        approver = service.call("approve", approval_id=approval_id, reason=reason)["approver"]
    else:
        approver = _approvals(ctx).decide(approval_id, "approve", reason=reason).approver
    _say(f"Approved {approval_id} as {approver}: the node will be replaced.")


@main.command()
@click.argument("approval_id")
@click.option(
    "--release", is_flag=True, help="Also uncordon the node (default: it stays cordoned)."
)
@click.option("--reason", default="", help="Why (recorded in the ledger and the workflow).")
@click.pass_context
@_fail_cleanly
def reject(ctx: click.Context, approval_id: str, release: bool, reason: str) -> None:
    """Reject replacing the node of APPROVAL_ID."""
    service = _service(ctx)
    if service:
        approver = service.call("reject", approval_id=approval_id, release=release, reason=reason)[
            "approver"
        ]
    else:
        approver = (
            _approvals(ctx).decide(approval_id, "reject", release=release, reason=reason).approver
        )
    outcome = "it will be uncordoned" if release else "it stays cordoned"
    _say(f"Rejected {approval_id} as {approver}: {outcome}.")


def _duration(_ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """Click callback: a ``30d``-style option as a timedelta, a usage error naming the option."""
    if value is None:
        return None
    try:
        return precision.parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


# history and stats mark repeat offenders the same way: one option, one default.
_recurrence_window = click.option(
    "--window",
    default="7d",
    show_default=True,
    callback=_duration,
    help="Recurrence window: a later alarm within it makes a repeat offender.",
)


@main.command()
@click.argument("node_or_instance", required=False, metavar="[NODE|INSTANCE]")
@click.option(
    "--node", help="Every transition of this node, one line each (hyperpod-i-... or i-...)."
)
@_recurrence_window
@click.option("--json", "as_json", is_flag=True, help="Print the events (or remediations) as JSON.")
@click.pass_context
@_fail_cleanly
def history(
    ctx: click.Context,
    node_or_instance: str | None,
    node: str | None,
    window: Any,
    as_json: bool,
) -> None:
    """Show recorded transitions (repeat offenders show up here).

    With NODE|INSTANCE: one row per remediation of that node (check and verdict, outcome,
    whether the alarm was right, every transition with who decided and why). With ``--node`` or
    nothing: every transition, one line each.
    """
    ledger = _ledger(ctx)
    if node_or_instance:
        instance_id = node_or_instance.removeprefix("hyperpod-")
        # Recurrence needs the other nodes' alarms too (a replacement on the same job).
        every = outcomes.mark_recurrences(outcomes.summarise(ledger.all_events()), window)
        mine = [r for r in every if r.instance_id == instance_id]
        if as_json:
            click.echo(json.dumps([_remediation_json(r) for r in mine], indent=2, default=str))
            return
        click.echo(remediations_table(mine))
        return
    if node:
        events = sorted(ledger.events(node.removeprefix("hyperpod-")), key=lambda e: e["at"])
    else:
        events = ledger.all_events()
    if as_json:
        click.echo(json.dumps(events, indent=2, default=str))
        return
    if not events:
        click.echo("No recorded transitions.")
        return
    stated: set[str] = set()
    screened: set[str] = set()
    for e in events:
        who = f" by {e['approver']}" if e.get("approver") else ""
        _say(
            f"{e['at']}  {e['pk']}  {e.get('node_name') or '-'}  {e['transition']}{who}  {e['remediation_id']}"
        )
        if e.get("resume") and e["remediation_id"] not in stated:
            # Once per remediation: the rule is the alarm's, the same on each of its events.
            stated.add(e["remediation_id"])
            _say(f"    resume rule: {e['resume']}")
        if e.get("screen") and e["remediation_id"] not in screened:
            # Once per remediation, on its first event that carries the screen's outcome.
            screened.add(e["remediation_id"])
            _say(f"    screen: {e['screen']}")


@main.command()
@click.argument("node")
@click.option("--reason", default="", help="Why (recorded in the ledger).")
@click.pass_context
@_fail_cleanly
def release(ctx: click.Context, node: str, reason: str) -> None:
    """Tell the blast-radius guard that NODE (hyperpod-i-... or i-...) is back in service.

    A node sdc-guard cordoned keeps counting against MAX_FRACTION until released: after a
    rejection that kept it cordoned, an approval timeout, a failure or an abandoned run.
    Uncordon it (kubectl uncordon) or replace it first: release reads the node and refuses one
    that is still cordoned (NodeStillCordoned); it does not change Kubernetes. Your IAM identity
    is recorded as who released it.
    """
    service = _service(ctx)
    if service:
        instance_id = service.call("release", node=node, reason=reason)["released"]
    else:
        instance_id = release_logic.release(
            _ledger(ctx),
            _direct_kube,
            node,
            released_by=caller_arn(),
            reason=reason,
        )
    _say(f"Released {instance_id}: it no longer counts against the blast-radius guard.")


def _direct_kube() -> KubeApi:
    """The Kubernetes API for the direct path's release check (EKS_CLUSTER_NAME, or the
    K8S_API_ENDPOINT / K8S_API_CA_DATA overrides, as the functions read them)."""
    settings = Settings()
    if not (settings.k8s_api_endpoint and settings.k8s_api_ca_data):
        try:
            _ = settings.eks_cluster_name  # raises when it is not set
        except ConfigurationError:
            raise ConfigurationError(
                "release checks that the node is uncordoned: set EKS_CLUSTER_NAME (the cluster "
                "whose node it is), or release through --approval-url"
            ) from None
    return KubeApi.from_settings(settings)


def _remediation_json(r: outcomes.Remediation) -> dict[str, Any]:
    return {
        "remediation_id": r.remediation_id,
        "instance_id": r.instance_id,
        "node_name": r.node_name,
        "job": r.job,
        "check": r.check,
        "verdict": r.verdict,
        "first_at": r.first_at,
        "outcome": r.outcome,
        "alarm_was": outcomes.classify(r),
        "repeat_offender": r.repeat,
        "dry_run": r.dry_run,
        "screen": r.screen,
        "screen_agreement": r.screen_agreement,
        "transitions": r.transitions,
    }


@main.command()
@click.option(
    "--since",
    default=None,
    callback=_duration,
    help="Only remediations that began within this long (30d, 12h, 2w; default: all).",
)
@_recurrence_window
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.pass_context
@_fail_cleanly
def stats(ctx: click.Context, since: Any, window: Any, as_json: bool) -> None:
    """How often each check x verdict was right: alarms, health-check confirmations,
    replacements, rejections, repeat offenders, a precision estimate with its 95 % interval, and
    whether the node screen agreed with the job (agreed / disagreed / no evidence).
    """
    remediations = outcomes.mark_recurrences(outcomes.summarise(_ledger(ctx).all_events()), window)
    start = precision.window_start(clock.now(), since)
    if start is not None:
        remediations = outcomes.since(remediations, start)
    rows = precision.table(remediations)
    if as_json:
        payload = {
            "since": clock.iso(start) if start else None,
            "definition": precision.PRECISION_DEFINITION,
            "screen_agreement_definition": precision.SCREEN_AGREEMENT_DEFINITION,
            "rows": [row.as_dict() for row in rows],
        }
        click.echo(json.dumps(payload, indent=2))
        return
    scope = f"since {clock.iso(start)}" if start else "the whole ledger"
    click.echo(stats_table(rows, scope=scope))


@main.command()
@click.option(
    "--cluster",
    envvar="SDC_CLUSTER",
    required=True,
    help="The HyperPod cluster the stack guards (env SDC_CLUSTER).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the run as JSON.")
@click.pass_context
@_fail_cleanly
def canary(ctx: click.Context, cluster: str, as_json: bool) -> None:
    """The newest canary run: every step it reached, and where it stopped."""
    run = RunStore(_ledger(ctx).table, cluster).latest()  # the ledger holds runs
    if as_json:
        click.echo(
            json.dumps(None if run is None else dataclasses.asdict(run), indent=2, default=str)
        )
        return
    click.echo(canary_table(run))


@main.command()
@click.argument("node")
@click.option(
    "--function",
    "function_name",
    envvar="SDC_SCREENER_FUNCTION",
    required=True,
    help="The idle screener function's name or ARN (in the stack output IdleScreenCommand; env "
    "SDC_SCREENER_FUNCTION).",
)
@_fail_cleanly
def screen(node: str, function_name: str) -> None:
    """Screen NODE now (an idle, schedulable HyperPod node): start the node screen's Job."""
    answer = screen_node(function_name, node)
    click.echo(f"screening {answer.get('node', node)}: job {answer.get('job')}")
