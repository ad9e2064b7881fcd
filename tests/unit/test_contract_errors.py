"""The exception class names are the contract between the Lambdas and the workflow."""

from __future__ import annotations

from infra.constructs.workflow import TERMINAL_ERRORS, TRANSIENT_ERRORS
from sdc_contract.errors import TERMINAL_ERROR_NAMES, TRANSIENT_ERROR_NAMES
from sdc_remediation import errors


def test_every_error_the_workflow_retries_or_catches_is_raised_by_the_lambdas():
    # Given the names the state machine's Retry and Catch clauses match on
    names = [
        n for n in (*TRANSIENT_ERRORS, *TERMINAL_ERRORS) if not n.startswith(("States.", "Lambda."))
    ]
    # Then each is a RemediationError class in lambdas/sdc_remediation/errors.py
    for name in names:
        cls = getattr(errors, name, None)
        assert isinstance(cls, type) and issubclass(cls, errors.RemediationError), name


def test_every_lambda_error_is_either_retried_or_caught():
    # Given every domain error the workflow can see (CLI-only errors never reach it)
    cli_only = {
        "ApprovalNotFound",
        "ApprovalExpired",
        "ApprovalAlreadyDecided",
        "NoCredentials",
        "NodeNotHeld",  # `release` (CLI and the approve function), never a workflow step
        "NodeStillCordoned",  # `release` too: the node must be uncordoned first
        "NodeInRemediation",  # `release` too: a remediation of the node is still open
    }
    raised = {
        name
        for name, cls in vars(errors).items()
        if isinstance(cls, type)
        and issubclass(cls, errors.RemediationError)
        and cls is not errors.RemediationError
    } - cli_only
    # Then the workflow has a Retry or a Catch for each by name
    assert raised <= set(TRANSIENT_ERRORS) | set(TERMINAL_ERRORS)


def test_the_workflow_and_the_lambdas_read_the_same_names_from_the_contract():
    # The state machine retries and catches the contract's names (plus Lambda's own throttling)
    assert set(TRANSIENT_ERROR_NAMES) <= set(TRANSIENT_ERRORS)
    assert set(TRANSIENT_ERRORS) - set(TRANSIENT_ERROR_NAMES) == {"Lambda.TooManyRequestsException"}
    assert TERMINAL_ERRORS == TERMINAL_ERROR_NAMES
    # and the Lambdas' retried classes are exactly the contract's transient names
    assert [cls.__name__ for cls in errors.TRANSIENT] == list(TRANSIENT_ERROR_NAMES)
    assert not set(TRANSIENT_ERROR_NAMES) & set(TERMINAL_ERROR_NAMES)
