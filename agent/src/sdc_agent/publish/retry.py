"""Which AWS failures are worth retrying, and the backoff between tries."""

from __future__ import annotations

import random

from .settings import RetryPolicy

try:  # botocore comes with the optional extra; without it nothing here is ever called.
    from botocore import exceptions as _botocore_errors
except ImportError:  # pragma: no cover - exercised only in images without boto3
    _botocore_errors = None

# Error codes AWS uses for throttling and server-side trouble (botocore's standard retry mode
# treats the same codes as transient).
TRANSIENT_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "InternalFailure",
        "InternalError",
        "InternalServerError",
        "InternalServiceError",
        "InternalServiceFault",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)


# Refusals of the caller's setup rather than of the request: once the role, the credentials or
# the log group are fixed, the very same record goes through, so it waits in the spool.
SETUP_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "SignatureDoesNotMatch",
        "InvalidSignatureException",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "AuthFailure",
        "OptInRequired",
        "ResourceNotFoundException",
    }
)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError, else ''."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def is_transient(exc: BaseException) -> bool:
    """True for failures another try may not have: network, timeouts, throttling, 5xx.

    A missing credential is transient too: IRSA / Pod Identity credentials can appear a moment
    after the container starts. Validation and permission errors are not.
    """
    if _botocore_errors is None:
        return False
    transient_types = (
        _botocore_errors.HTTPClientError,  # read timeouts, connections closed or reset
        _botocore_errors.ConnectionError,  # refused, connect timeouts, proxy errors
        _botocore_errors.NoCredentialsError,
        _botocore_errors.CredentialRetrievalError,
    )
    if isinstance(exc, transient_types):
        return True
    if isinstance(exc, _botocore_errors.ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return error_code(exc) in TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
    return False


def backoff_delay(policy: RetryPolicy, retry_index: int, rng: random.Random) -> float:
    """Seconds before retry ``retry_index`` (0-based): full jitter on an exponential cap.

    Full jitter spreads the retries of many clients hit by the same outage (AWS Architecture
    Blog, "Exponential Backoff And Jitter", 2015).
    """
    cap = min(policy.max_delay, policy.base_delay * (2**retry_index))
    return rng.uniform(0.0, cap)


def is_rejection(exc: BaseException) -> bool:
    """True when AWS refused the request itself as invalid, so the same record never goes
    through (InvalidParameterValue, InvalidParameterCombination, MissingParameter, any other
    4xx code, and botocore's own parameter validation).

    Not for transient failures (:func:`is_transient`), not for refusals of the caller's setup
    (``SETUP_CODES``: permissions, credentials, a missing log group), and not for errors of our
    own code: those records stay in the spool.
    """
    if _botocore_errors is None:
        return False
    if isinstance(exc, _botocore_errors.ParamValidationError):
        return True
    if not isinstance(exc, _botocore_errors.ClientError) or is_transient(exc):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    code = error_code(exc)
    return bool(code) and code not in SETUP_CODES and isinstance(status, int) and status < 500
