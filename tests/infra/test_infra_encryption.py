"""Customer managed keys on what the stack keeps at rest (issue 32): each table under its own
rotating key, every log group under the logs key, the logs key usable by CloudWatch Logs for the
stack's log groups only, and every principal that uses a table granted that table's key, through
DynamoDB only, with exact actions."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.infra_template import as_list, flatten, matches, resources

pytestmark = pytest.mark.slow


def _principal_statements(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(principal, statement) for every inline policy's role and every managed policy."""
    out: list[tuple[str, dict[str, Any]]] = []
    for policy in resources(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            out += [(role["Ref"], s) for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    for logical_id, policy in resources(template, "AWS::IAM::ManagedPolicy").items():
        out += [(logical_id, s) for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    return out


def _table_keys(template: dict[str, Any]) -> dict[str, str]:
    """Table logical id -> the logical id of the key its SSESpecification names."""
    keys = {}
    for table_id, table in resources(template, "AWS::DynamoDB::Table").items():
        sse = table["Properties"]["SSESpecification"]
        assert sse["SSEEnabled"] is True and sse["SSEType"] == "KMS", table_id
        key_id, attribute = sse["KMSMasterKeyId"]["Fn::GetAtt"]
        assert attribute == "Arn"
        keys[table_id] = key_id
    return keys


@pytest.mark.parametrize("which", ["default_synth", "variant_synth"])
def test_each_table_is_encrypted_under_its_own_rotating_customer_managed_key(
    which: str, request: pytest.FixtureRequest
) -> None:
    # Given the stack's tables and keys
    template = request.getfixturevalue(which).template
    keys = resources(template, "AWS::KMS::Key")
    table_keys = _table_keys(template)
    # Then both tables name a key of the stack (not the AWS managed aws/dynamodb), one each
    assert len(table_keys) == 2
    assert len(set(table_keys.values())) == 2
    tables = resources(template, "AWS::DynamoDB::Table")
    for table_id, key_id in table_keys.items():
        assert keys[key_id]["Properties"]["EnableKeyRotation"] is True
        # And a key lives as long as its table: the retained ledger's key is retained too
        assert keys[key_id].get("DeletionPolicy", "Delete") == tables[table_id].get(
            "DeletionPolicy", "Delete"
        ), table_id
    (ledger_id,) = [t for t, r in tables.items() if len(r["Properties"]["KeySchema"]) == 2]
    assert keys[table_keys[ledger_id]]["DeletionPolicy"] == "Retain"


STACK_NAMES = {
    "default_synth": "SdcGuard-example-hyperpod-cluster",  # infra/app.py stack_name
    "variant_synth": "SdcGuard-ml-prod",
}


@pytest.mark.parametrize("which", ["default_synth", "variant_synth"])
def test_every_log_group_is_encrypted_under_the_logs_key_cloudwatch_logs_may_use_for_it(
    which: str, request: pytest.FixtureRequest
) -> None:
    # Given the stack's log groups and the key they name
    synth = request.getfixturevalue(which)
    template = synth.template
    groups = resources(template, "AWS::Logs::LogGroup")
    assert groups
    key_ids = {g["Properties"]["KmsKeyId"]["Fn::GetAtt"][0] for g in groups.values()}
    # Then every one names the same key, neither a table's nor the topic's
    (key_id,) = key_ids
    assert key_id not in _table_keys(template).values()
    key = resources(template, "AWS::KMS::Key")[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    # And its policy lets this region's CloudWatch Logs use it only with an encryption context
    # naming one of the stack's log groups
    (logs_statement,) = [
        s for s in key["KeyPolicy"]["Statement"] if "Service" in s.get("Principal", {})
    ]
    assert flatten(logs_statement["Principal"]["Service"]) == (
        "logs.<AWS::Region>.<AWS::URLSuffix>"
    )
    patterns = [
        flatten(p)
        for p in as_list(
            logs_statement["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
        )
    ]
    assert list(logs_statement["Condition"]) == ["ArnLike"]
    prefix = "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:"
    assert all(p.startswith(prefix) and p != f"{prefix}*" for p in patterns)
    stack_name = STACK_NAMES[which]
    for logical_id, group in groups.items():
        name = group["Properties"].get("LogGroupName")
        # A named group is matched by name; an unnamed one CloudFormation names
        # "<stack name>-<logical id>-<suffix>"
        arn = prefix + (name if name else f"{stack_name}-{logical_id}-ABC")
        assert any(matches(p, arn) for p in patterns), (logical_id, patterns)


@pytest.mark.parametrize("which", ["default_synth", "variant_synth"])
def test_whoever_uses_a_table_may_use_its_key_through_dynamodb_only(
    which: str, request: pytest.FixtureRequest
) -> None:
    # Given every principal's statements and the tables' keys
    template = request.getfixturevalue(which).template
    table_keys = _table_keys(template)
    statements = _principal_statements(template)
    writes = {"dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"}
    for table_id, key_id in table_keys.items():
        table_arn, key_arn = f"<{table_id}.Arn>", f"<{key_id}.Arn>"
        users: dict[str, set[str]] = {}
        for principal, s in statements:
            if s.get("Effect", "Allow") == "Allow" and table_arn in map(
                flatten, as_list(s["Resource"])
            ):
                users.setdefault(principal, set()).update(as_list(s["Action"]))
        assert users, table_id
        for principal, actions in users.items():
            # Then each principal using the table is granted its key
            kms = [
                s
                for p, s in statements
                if p == principal and key_arn in map(flatten, as_list(s["Resource"]))
            ]
            granted = {a for s in kms for a in as_list(s["Action"])}
            assert {"kms:Decrypt", "kms:DescribeKey"} <= granted, (principal, table_id)
            # And a writer may also encrypt under it; a reader may not
            if actions & writes:
                assert {"kms:Encrypt", "kms:GenerateDataKey"} <= granted, principal
            else:
                assert not granted & {"kms:Encrypt", "kms:GenerateDataKey"}, principal
            # And only through DynamoDB, with exact actions on the exact key
            for s in kms:
                assert s["Condition"] == {
                    "StringEquals": {
                        "kms:ViaService": {
                            "Fn::Join": [
                                "",
                                [
                                    "dynamodb.",
                                    {"Ref": "AWS::Region"},
                                    ".",
                                    {"Ref": "AWS::URLSuffix"},
                                ],
                            ]
                        }
                    }
                }, principal
                assert all("*" not in a for a in as_list(s["Action"])), s
                assert [flatten(r) for r in as_list(s["Resource"])] == [key_arn]
    # And no principal may use any KMS key on "*" or a key it does not use a table of
    for principal, s in statements:
        if any(a.startswith("kms:") for a in as_list(s["Action"])):
            assert "*" not in as_list(s["Resource"]), (principal, s)
