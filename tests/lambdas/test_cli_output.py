"""The operator CLI prints what others wrote (a report's text through the record step, a reason
an operator typed, a request's evidence): no escape sequence or control character reaches the
terminal from `pending`, `stats` or `history`; `--json` escapes them as JSON does."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from remediation_factories import APPROVALS, CLUSTER, LEDGER

from sdc_remediation import aws, clock
from sdc_remediation.cli import main
from sdc_remediation.dal import keys
from sdc_remediation.dal.dynamo import to_item

ESCAPE = "\x1b[2J\x1b]0;pwned\x07"
"""Clear the screen, set the terminal's title: what a hostile string would try."""


def _seed(cloud) -> None:
    ddb = aws.client("dynamodb")
    at = clock.iso(clock.now())
    for n, transition in enumerate(["admitted", "cordoned", "rejected"]):
        ddb.put_item(
            TableName=LEDGER,
            Item=to_item(
                {
                    **keys.event(cloud.nodes[0], at, "r-1", n),
                    "remediation_id": "r-1",
                    "transition": transition,
                    "at": at,
                    "cluster": CLUSTER,
                    "check": "compute",
                    "verdict": f"persistent{ESCAPE}",
                    "job": f"job{ESCAPE}",
                    "node_name": f"hyperpod-{cloud.nodes[0]}",
                    "approver": f"arn:aws:iam::123456789012:user/x{ESCAPE}",
                    "reason": f"looks fine\n{ESCAPE}",
                    "decision": "reject" if transition == "rejected" else None,
                    "resume": f"resume {ESCAPE}",
                }
            ),
        )
    ddb.put_item(
        TableName=APPROVALS,
        Item=to_item(
            {
                **keys.approval("a-0123456789abcdef"),
                "task_token": "t",
                "remediation_id": "r-1",
                "instance_id": cloud.nodes[0],
                "node_name": f"hyperpod-{cloud.nodes[0]}",
                "evidence": json.dumps(
                    {
                        "check": "compute",
                        "verdict": ESCAPE,
                        "suggested_action": ESCAPE,
                        "resume": {"sentence": ESCAPE},
                    }
                ),
                "status": "pending",
                "created_at": clock.iso(clock.now()),
                "expires_at": int(clock.now().timestamp()) + 3600,
                "decide_by": int(clock.now().timestamp()) + 3600,
            }
        ),
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--approvals-table", APPROVALS, "pending"],
        ["--ledger-table", LEDGER, "stats"],
        ["--ledger-table", LEDGER, "history"],
        ["--ledger-table", LEDGER, "history", "--node", "i-00000000000000001"],
        ["--ledger-table", LEDGER, "history", "i-00000000000000001"],
    ],
    ids=["pending", "stats", "history", "history-node", "history-remediations"],
)
def test_no_escape_sequence_reaches_the_terminal(cloud, args):
    # Given a ledger and a request holding escape sequences
    _seed(cloud)
    # When an operator lists them
    result = CliRunner().invoke(main, args)
    # Then the output shows them defused: no ESC, BEL or other control character but newlines
    assert result.exit_code == 0, result.output
    assert not [c for c in result.output if c < " " and c != "\n"], repr(result.output)
    assert "[2J" in result.output or "stats" in args  # visible, not executed


def test_json_output_escapes_them(cloud):
    _seed(cloud)
    result = CliRunner().invoke(main, ["--ledger-table", LEDGER, "history", "--json"])
    assert result.exit_code == 0 and "\x1b" not in result.output and "\\u001b" in result.output


def test_an_error_carrying_what_a_proxy_answered_stays_one_printable_line(cloud, monkeypatch):
    # Given an approval URL behind something that answers with text of its own (a proxy's
    # error page, with escape sequences and line breaks)
    from sdc_remediation.clients import approval_url

    page = f"<html>{ESCAPE}\nBad gateway\n</html>".encode()
    monkeypatch.setattr(approval_url, "_send", lambda request: (502, page))
    url = "https://abcdefghij0123456789.lambda-url.us-east-1.on.aws/"

    # When an operator lists the pending approvals through it
    result = CliRunner().invoke(main, ["--approval-url", url, "pending"])

    # Then the error says what came back on one line of printable text, exit 1
    assert result.exit_code == 1 and "Bad gateway" in result.output
    assert not [c for c in result.output if c < " " and c != "\n"], repr(result.output)
    assert result.output.count("\n") == 1
