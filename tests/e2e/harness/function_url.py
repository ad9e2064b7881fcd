"""A loopback stand-in for the approve function's URL (a Lambda function URL with AWS_IAM auth).

The operator CLI sends its decisions to ``ApprovalUrl``, SigV4-signed with the caller's
credentials; Lambda authenticates the signature and gives the function the caller's ARN. Here an
HTTP server on 127.0.0.1 plays that part for the end-to-end tests and ``make demo``:

What it proves: the CLI really signs its request (AWS4-HMAC-SHA256, service ``lambda``, this
region), the signature is checked against the caller's secret key and the body it covers (a
request altered on the way, or signed with another secret, is answered 403 as AWS would), the
caller's ARN is the principal STS names for that access key, and the real approve handler, with
its template environment, decides with that ARN as the approver, applying its own decision
deadline and single-use claim. The approver the ledger and the workflow record is therefore the
authenticated one, whatever the body says.

What it cannot prove: IAM policy evaluation (whether a role may call ``lambda:InvokeFunctionUrl``
is decided by AWS; tests/infra asserts the policies), the function URL's throttling and payload
limits, and TLS (the real URL is https; the CLI allows plain http only to a loopback address).

:class:`ApprovalUrl` is the one home of what both embedded chains (the template-built
``LocalPipeline`` and the ``DeployedChain`` on what CloudFormation created) need around the
stand-in: the keys the embedded IAM knows, the principal STS names for each, an operator's
assumed-role credentials, and the approve function's answer as its URL returns it.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sdc_remediation.clients.approval_url import function_url_event

CLOCK_SKEW = timedelta(minutes=5)
"""How far a request's X-Amz-Date may be from now: AWS refuses older signatures as replays."""


class SignatureRefused(Exception):
    """The request is not one AWS would authenticate (missing, malformed or wrong signature)."""


def verify_signature(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    *,
    secret_for: Callable[[str], Credentials | None],
    region: str,
    now: datetime | None = None,
) -> str:
    """Check a SigV4 request as Lambda's function URL would; returns the caller's access key.

    The signature is computed again over the headers the request says it signed and the body it
    carries, with the secret of its access key (``secret_for``), and compared in constant time.
    """
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        raise SignatureRefused("the request is not signed with AWS4-HMAC-SHA256")
    fields = dict(
        part.strip().split("=", 1) for part in auth[len("AWS4-HMAC-SHA256 ") :].split(",")
    )
    try:
        access_key, date, signed_region, service, terminator = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        signature = fields["Signature"]
    except (KeyError, ValueError) as exc:
        raise SignatureRefused(f"malformed Authorization header: {exc}") from exc
    if (signed_region, service, terminator) != (region, "lambda", "aws4_request"):
        raise SignatureRefused(
            f"signed for {service} in {signed_region}, not for lambda in {region}"
        )
    stamp = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(stamp, SIGV4_TIMESTAMP).replace(tzinfo=UTC)
    except ValueError as exc:
        raise SignatureRefused(f"bad X-Amz-Date {stamp!r}") from exc
    if abs((now or datetime.now(UTC)) - signed_at) > CLOCK_SKEW or not stamp.startswith(date):
        raise SignatureRefused(f"the signature's date {stamp} is outside the allowed window")
    credentials = secret_for(access_key)
    if credentials is None:
        raise SignatureRefused(f"unknown access key {access_key}")
    if "host" not in signed:
        raise SignatureRefused("the host header is not signed")
    if credentials.token and (
        "x-amz-security-token" not in signed
        or headers.get("x-amz-security-token") != credentials.token
    ):
        # Temporary credentials are valid only with their session token, signed with them.
        raise SignatureRefused("the session token is missing or not the access key's")
    # The request as it was signed: only the headers the signature covers (the HTTP client adds
    # others on the way, such as Content-Length and Accept-Encoding).
    request = AWSRequest(
        method=method,
        url=url,
        data=body,
        headers={name: headers[name] for name in signed if name in headers},
    )
    request.context["timestamp"] = stamp
    signer = SigV4Auth(credentials, "lambda", region)
    expected = signer.signature(
        signer.string_to_sign(request, signer.canonical_request(request)), request
    )
    if not hmac.compare_digest(expected, signature):
        raise SignatureRefused("the signature does not match the request")
    return access_key


class FunctionUrlStandIn:
    """``with FunctionUrlStandIn(...) as url:`` serves ``url`` (http://127.0.0.1:PORT/).

    ``secret_for(access_key)`` gives the credentials AWS holds for a key (None: unknown key);
    ``principal_of(credentials)`` the ARN AWS authenticates them as; ``invoke(event)`` runs the
    approve function and returns its function URL response (statusCode, body). ``events`` keeps
    every event handed to the function, for tests to inspect.
    """

    def __init__(
        self,
        *,
        region: str,
        secret_for: Callable[[str], Credentials | None],
        principal_of: Callable[[Credentials], str],
        invoke: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """Prepare; the server starts in ``__enter__``."""
        self.region = region
        self.secret_for = secret_for
        self.principal_of = principal_of
        self.invoke = invoke
        self.events: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> str:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                status, answer = standin.serve(
                    self.command,
                    f"http://{self.headers.get('host')}{self.path}",
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                )
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                """Quiet: one line per request would interleave with the demo's timeline."""

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, name="function-url", daemon=True)
        thread.start()
        self._stack.callback(server.server_close)
        self._stack.callback(thread.join, 30)
        self._stack.callback(server.shutdown)
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}/"
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def serve(
        self, method: str, url: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes]:
        """One request: authenticate it, then hand the function the event Lambda would."""
        try:
            access_key = verify_signature(
                method, url, headers, body, secret_for=self.secret_for, region=self.region
            )
        except SignatureRefused as exc:
            self.refused.append(str(exc))
            # What Lambda answers for a request it cannot authenticate: 403, no function call.
            return 403, json.dumps({"Message": f"Forbidden: {exc}"}).encode()
        credentials = self.secret_for(access_key)
        assert credentials is not None  # verify_signature found it
        request = AWSRequest(method=method, url=url, data=body, headers=headers).prepare()
        event = function_url_event(request, self.principal_of(credentials))
        self.events.append(event)
        response = self.invoke(event)
        return int(response["statusCode"]), str(response.get("body", "")).encode()


LambdaInvoke = Callable[[str, Any, dict[str, str]], bytes]
"""How a chain runs one of its functions: (function name or ARN, JSON body, response headers to
fill) -> the response payload; ``x-amz-function-error`` set in the headers marks a function
error, as Lambda's Invoke API does."""

TEST_CREDENTIALS = Credentials("testing", "testing", "testing")
"""The embedded AWS's own test credentials (AWS_ACCESS_KEY_ID etc. of the chains' environment)."""


class ApprovalUrl:
    """The approve function's AWS_IAM URL on an embedded AWS: ``with ApprovalUrl(...) as url:``.

    Serves a :class:`FunctionUrlStandIn` on a loopback address (``url.url``; the stand-in itself
    is ``url.standin``) whose requests run ``function`` through the chain's ``invoke``, as the
    Lambda service runs the function behind its URL. The embedded AWS at ``endpoint`` plays IAM
    and STS: a request is authenticated only when signed with a key it issued (the test
    credentials, or an operator's from :meth:`operator_environment`), and the approver is the
    ARN its GetCallerIdentity names for that key.

    Threads: the HTTP server answers on its own threads; nothing here reads or writes
    ``os.environ`` (every boto3 session is given its credentials and region).
    """

    def __init__(
        self, *, endpoint: str, region: str, account: str, function: str, invoke: LambdaInvoke
    ) -> None:
        """Prepare; the server starts in ``__enter__``. ``function`` is the approve function's
        name or ARN as ``invoke`` knows it."""
        self.endpoint = endpoint
        self.region = region
        self.account = account
        self.function = function
        self._invoke = invoke
        self._known_keys: dict[str, Credentials] = {}
        self._keys_lock = threading.Lock()
        self._principals: dict[str, str] = {}
        self._principals_lock = threading.Lock()  # held across a GetCallerIdentity
        self._stack = contextlib.ExitStack()
        self.add_credentials(TEST_CREDENTIALS)
        self.standin = FunctionUrlStandIn(
            region=region,
            secret_for=self._secret_for,
            principal_of=self._principal_of,
            invoke=self._invoke_function,
        )
        self.url = ""

    def __enter__(self) -> ApprovalUrl:
        # Built here, in the starting thread: a boto3 session is not thread-safe, its clients are.
        self._sts = self._session(TEST_CREDENTIALS).client("sts", endpoint_url=self.endpoint)
        self.url = self._stack.enter_context(self.standin)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def add_credentials(self, credentials: Credentials) -> None:
        """Let the URL authenticate requests signed with ``credentials`` (what IAM knows of a
        key: its secret). The embedded AWS's test credentials are known from the start."""
        with self._keys_lock:
            self._known_keys[credentials.access_key] = credentials

    def operator_environment(self, role: str, session: str) -> dict[str, str]:
        """Credentials of an operator who assumed ``role`` (for a CLI in its own process): the URL
        then authenticates them as ``arn:aws:sts::<account>:assumed-role/<role>/<session>``."""
        answer = self._sts.assume_role(
            RoleArn=f"arn:aws:iam::{self.account}:role/{role}", RoleSessionName=session
        )["Credentials"]
        credentials = Credentials(
            answer["AccessKeyId"], answer["SecretAccessKey"], answer["SessionToken"]
        )
        self.add_credentials(credentials)
        return {
            "AWS_ACCESS_KEY_ID": credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
            "AWS_SESSION_TOKEN": credentials.token,
        }

    def _session(self, credentials: Credentials) -> boto3.session.Session:
        return boto3.session.Session(
            aws_access_key_id=credentials.access_key,
            aws_secret_access_key=credentials.secret_key,
            aws_session_token=credentials.token,
            region_name=self.region,
        )

    def _secret_for(self, access_key: str) -> Credentials | None:
        with self._keys_lock:
            return self._known_keys.get(access_key)

    def _principal_of(self, credentials: Credentials) -> str:
        """The ARN AWS authenticates ``credentials`` as: STS GetCallerIdentity with that key."""
        with self._principals_lock:
            if credentials.access_key not in self._principals:
                sts = self._session(credentials).client("sts", endpoint_url=self.endpoint)
                self._principals[credentials.access_key] = sts.get_caller_identity()["Arn"]
            return self._principals[credentials.access_key]

    def _invoke_function(self, event: dict[str, Any]) -> dict[str, Any]:
        """Run the approve function for a function URL event; its HTTP response. A function
        error is answered 502, as a function URL does."""
        response_headers: dict[str, str] = {}
        out = json.loads(self._invoke(self.function, json.dumps(event), response_headers))
        if response_headers.get("x-amz-function-error"):
            return {"statusCode": 502, "body": json.dumps({"Message": "Internal Server Error"})}
        return out
