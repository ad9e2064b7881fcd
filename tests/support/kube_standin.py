"""A loopback HTTPS Kubernetes API stand-in: real TLS with a CA made per test, EKS token checks.

Serves the calls the remediation Lambdas make (GET/PATCH /api/v1/nodes/<name>, GET of one pod,
and the pod list of a namespace with ``labelSelector``, ``fieldSelector``, ``limit`` and
``continue`` as the API server takes them), records every request, and can fail on demand
(status codes or a hang) so the error mapping is tested against a real HTTP stack. Reusable by the
end-to-end harness: ``with KubeStandIn() as k8s: env K8S_API_ENDPOINT=k8s.url,
K8S_API_CA_DATA=k8s.ca_b64``.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
import json
import ssl
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

TOKEN_PREFIX = "k8s-aws-v1."
JOB_LABEL = "training.kubeflow.org/job-name"
"""The job-name label the Kubeflow training operator puts on every pod of a PyTorchJob."""
POD_FIELDS = {
    "metadata.name": lambda p: p["metadata"]["name"],
    "metadata.namespace": lambda p: p["metadata"]["namespace"],
    "spec.nodeName": lambda p: p["spec"].get("nodeName", ""),
    "status.phase": lambda p: p.get("status", {}).get("phase", ""),
}
"""The pod fields this stand-in selects on (the API server supports a few more, e.g.
spec.restartPolicy; any other field is a 400, as there)."""


def make_ca_and_server_cert(hostname: str = "127.0.0.1") -> tuple[bytes, bytes, bytes]:
    """(CA PEM, server cert PEM, server key PEM) for a server at ``hostname`` (an IP)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sdc-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(hostname)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def decode_token(auth_header: str) -> str | None:
    """The presigned STS URL inside an EKS bearer token, or None when the format is wrong."""
    if not auth_header.startswith("Bearer " + TOKEN_PREFIX):
        return None
    b64 = auth_header[len("Bearer " + TOKEN_PREFIX) :]
    if "=" in b64:  # EKS tokens carry no base64 padding
        return None
    try:
        return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).decode()
    except ValueError:
        return None


def token_is_valid(auth_header: str) -> bool:
    """What the EKS authenticator checks before calling STS: a presigned GetCallerIdentity URL
    on an STS host, signed over the x-k8s-aws-id header (whose value, the cluster name, is bound
    by the signature and checked by STS itself), short-lived."""
    url = decode_token(auth_header)
    if url is None:
        return False
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    signed = query.get("X-Amz-SignedHeaders", [""])[0].split(";")
    return (
        parts.scheme == "https"
        and parts.hostname is not None
        and parts.hostname.startswith("sts.")
        and query.get("Action") == ["GetCallerIdentity"]
        and query.get("Version") == ["2011-06-15"]
        and "x-k8s-aws-id" in signed
        and "X-Amz-Signature" in query
        and 0 < int(query.get("X-Amz-Expires", ["0"])[0]) <= 900
    )


class SelectorError(ValueError):
    """A selector the API server would refuse (400 BadRequest)."""


def _requirements(selector: str) -> list[tuple[str, str, str]]:
    """``a=b,c!=d,e==f`` -> [(key, op, value)]: equality-based requirements, comma = AND."""
    out = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        for op in ("!=", "==", "="):
            key, sep, value = part.partition(op)
            if sep:
                out.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
                break
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return out


def matches_labels(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selection as the API server does it (a missing label matches
    ``!=`` and never ``=``)."""
    for key, op, value in _requirements(selector):
        present = labels.get(key)
        if (op == "=") != (present == value):
            return False
    return True


def matches_fields(pod: dict[str, Any], selector: str) -> bool:
    """Field selection on the pod fields of ``POD_FIELDS``; another field is a SelectorError."""
    for key, op, value in _requirements(selector):
        if key not in POD_FIELDS:
            raise SelectorError(f'"{key}" is not a known field selector')
        if (op == "=") != (POD_FIELDS[key](pod) == value):
            return False
    return True


def _containers(gpus: int) -> dict[str, Any]:
    """A pod spec's containers asking for ``gpus`` GPUs (nothing when 0, as before)."""
    if not gpus:
        return {}
    limits = {"nvidia.com/gpu": str(gpus)}
    return {"containers": [{"name": "trainer", "resources": {"limits": limits}}]}


def strategic_merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Enough of a strategic-merge patch for maps: nested merge, ``None`` deletes a key."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = strategic_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class Recorded:
    """One request the stand-in received."""

    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any


@dataclass
class KubeStandIn:
    """The stand-in server; use as a context manager."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    fail_statuses: list[int] = field(default_factory=list)
    hang_seconds: float = 0.0
    down: bool = False
    """Answer every request 503 (the API server unreachable behind its load balancer)."""
    nodes_down: bool = False
    """Answer requests for nodes 503 and serve the rest (pods): an outage that hits cordon
    but not localize's pod check."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while a request is served; hold it to change nodes from another thread."""

    def add_node(
        self, name: str, labels: dict[str, str] | None = None, unschedulable: bool = False
    ) -> None:
        """Register a node object."""
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {}), "annotations": {}},
            "spec": {"unschedulable": True} if unschedulable else {},
        }

    def remove_node(self, name: str) -> None:
        """Forget a node (the instance behind it was replaced)."""
        with self.lock:
            self.nodes.pop(name, None)

    def set_labels(self, name: str, labels: dict[str, str]) -> None:
        """Change a node's labels as a controller on the cluster would (HyperPod's agents)."""
        with self.lock:
            if name in self.nodes:
                self.nodes[name]["metadata"]["labels"].update(labels)

    def add_pod(
        self,
        name: str,
        node: str,
        namespace: str = "default",
        *,
        labels: dict[str, str] | None = None,
        phase: str = "Running",
        finished_at: str | None = None,
        started: bool = True,
        owner: dict[str, Any] | None = None,
        gpus: int = 0,
    ) -> None:
        """Register a pod scheduled on ``node``, with the status the kubelet gives it.

        ``phase`` Running: started, its container running. Succeeded/Failed: its container
        terminated at ``finished_at`` (started then too). ``started=False``: the kubelet never
        started a container (an image that does not pull: Pending and waiting, or ended without
        a start). ``owner``: its controller owner reference (``{"apiVersion", "kind", "name"}``,
        a training operator's job), none for a bare pod. ``gpus``: the ``nvidia.com/gpu`` its
        container asks for (none when 0).
        """
        status: dict[str, Any] = {"phase": phase}
        if phase != "Pending":
            status["startTime"] = finished_at or "2026-01-01T00:00:00Z"
        if not started:
            waiting = {"waiting": {"reason": "ImagePullBackOff"}}
            status["containerStatuses"] = [{"name": "trainer", "state": waiting}]
        elif finished_at is not None:
            terminated = {"startedAt": finished_at, "finishedAt": finished_at}
            status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": terminated}}]
        elif phase == "Running":
            running = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
            status["containerStatuses"] = [{"name": "trainer", "state": running}]
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
        }
        if owner is not None:
            metadata["ownerReferences"] = [
                {"uid": f"uid-{owner['name']}", "controller": True, **owner}
            ]
        with self.lock:
            self.pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": metadata,
                    "spec": {"nodeName": node, **_containers(gpus)},
                    "status": status,
                }
            )

    def add_job_pod(
        self,
        job: str,
        node: str,
        namespace: str = "default",
        *,
        name: str | None = None,
        label: str = JOB_LABEL,
        bare: bool = False,
        **kwargs: Any,
    ) -> str:
        """Register a pod of training job ``job`` on ``node``, as the Kubeflow training operator
        creates it: its job-name ``label`` and a controller owner reference to the
        ``PyTorchJob`` ``job`` (``bare=True``: the label only, a pod a namespace editor made,
        no owner); returns the pod's name."""
        if not bare:
            kwargs.setdefault(
                "owner", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": job}
            )
        with self.lock:
            name = name or f"{job}-worker-{len(self.pods)}"
            self.add_pod(name, node, namespace, labels={label: job}, **kwargs)
        return name

    @property
    def patches(self) -> list[Recorded]:
        """Every PATCH received."""
        return [r for r in self.requests if r.method == "PATCH"]

    def __enter__(self) -> KubeStandIn:
        ca, cert, key = make_ca_and_server_cert()
        self._dir = tempfile.TemporaryDirectory()
        cert_path, key_path = Path(self._dir.name, "cert.pem"), Path(self._dir.name, "key.pem")
        cert_path.write_bytes(cert)
        key_path.write_bytes(key)
        self.ca_pem = ca
        self.ca_b64 = base64.b64encode(ca).decode()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hang_seconds = 0.0
        self._server.shutdown()
        self._server.server_close()
        self._dir.cleanup()


def _make_handler(api: KubeStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str) -> None:
            self._reply(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "code": code,
                },
            )

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            api.requests.append(
                Recorded(method, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            if api.down or (api.nodes_down and self.path.startswith("/api/v1/nodes")):
                self._status(503, "ServiceUnavailable")
                return
            if api.hang_seconds:
                time.sleep(api.hang_seconds)
                return
            if api.fail_statuses:
                self._status(api.fail_statuses.pop(0), "Injected")
                return
            if not token_is_valid(self.headers.get("Authorization", "")):
                self._status(401, "Unauthorized")
                return
            with api.lock:
                self._route(method, body)

        def _route(self, method: str, body: Any) -> None:
            parts = urllib.parse.urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            if segments[:3] == ["api", "v1", "nodes"] and len(segments) == 4:
                name = urllib.parse.unquote(segments[3])
                if name not in api.nodes:
                    self._status(404, "NotFound")
                    return
                if method == "PATCH":
                    if self.headers.get("Content-Type") != "application/strategic-merge-patch+json":
                        self._status(415, "UnsupportedMediaType")
                        return
                    api.nodes[name] = strategic_merge(api.nodes[name], body or {})
                self._reply(200, api.nodes[name])
                return
            if (
                len(segments) == 5
                and segments[:3] == ["api", "v1", "namespaces"]
                and segments[4] == "pods"
                and method == "GET"
            ):
                namespace = urllib.parse.unquote(segments[3])
                query = urllib.parse.parse_qs(parts.query)
                try:
                    items = [
                        p
                        for p in api.pods
                        if p["metadata"]["namespace"] == namespace
                        and matches_labels(
                            p["metadata"].get("labels") or {},
                            query.get("labelSelector", [""])[0],
                        )
                        and matches_fields(p, query.get("fieldSelector", [""])[0])
                    ]
                except SelectorError as exc:
                    self._status(400, f"BadRequest: {exc}")
                    return
                start = int(query.get("continue", ["0"])[0] or 0)
                limit = int(query.get("limit", ["0"])[0] or 0) or len(items) or 1
                page = items[start : start + limit]
                metadata: dict[str, Any] = {"resourceVersion": "1"}
                if start + limit < len(items):
                    metadata["continue"] = str(start + limit)
                self._reply(
                    200,
                    {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": page},
                )
                return
            if (
                len(segments) == 6
                and segments[:3] == ["api", "v1", "namespaces"]
                and segments[4] == "pods"
                and method == "GET"
            ):
                namespace = urllib.parse.unquote(segments[3])
                name = urllib.parse.unquote(segments[5])
                found = [
                    p
                    for p in api.pods
                    if p["metadata"]["name"] == name and p["metadata"]["namespace"] == namespace
                ]
                if not found:
                    self._status(404, "NotFound")
                    return
                self._reply(200, found[0])
                return
            if segments == ["api", "v1", "pods"] and method == "GET":
                # Every namespace's pods (the idle screener: fieldSelector spec.nodeName).
                query = urllib.parse.parse_qs(parts.query)
                try:
                    items = [
                        p
                        for p in api.pods
                        if matches_fields(p, query.get("fieldSelector", [""])[0])
                    ]
                except SelectorError as exc:
                    self._status(400, f"BadRequest: {exc}")
                    return
                self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                return
            if segments == ["api", "v1", "nodes"] and method == "GET":
                self._reply(
                    200, {"kind": "NodeList", "apiVersion": "v1", "items": list(api.nodes.values())}
                )
                return
            self._status(404, "NotFound")

        def do_GET(self) -> None:
            self._handle("GET")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

    return Handler
