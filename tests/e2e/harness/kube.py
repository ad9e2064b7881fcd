"""A loopback Kubernetes API stand-in: the nodes and pods of a HyperPod EKS cluster, over HTTPS.

It replaces the EKS API server for the cordon path and for rank -> pod -> node lookups. It holds
nodes (``hyperpod-i-...``) and pods in memory, serves the few core/v1 endpoints the Lambdas use
(GET/LIST/PATCH nodes, GET/LIST pods), applies merge patches the way the API server applies a
strategic merge patch to these fields (maps merge, ``null`` deletes), requires an EKS bearer token
(``k8s-aws-v1.`` + base64url), and serves TLS with a CA generated at start-up so the client's
certificate verification really runs. It can be made to fail (HTTP 5xx, or down) to exercise
retries. What it cannot prove: RBAC, admission webhooks, or the real server's patch semantics for
fields other than labels, annotations and spec.unschedulable.
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

TOKEN_PREFIX = "k8s-aws-v1."


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 merge (what a strategic merge patch does to maps and scalars)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _self_signed_tls(workdir: Path) -> tuple[ssl.SSLContext, str]:
    """A CA and a server certificate for 127.0.0.1; returns (server context, CA PEM base64)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sdc-local-kube-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = workdir / "server.pem", workdir / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    return context, base64.b64encode(ca_pem).decode()


@dataclass
class KubeState:
    """What the stand-in holds, and what it was asked."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    """Every request answers 503 (the API server is unreachable behind the load balancer)."""
    fail_next: list[int] = field(default_factory=list)
    """Status codes to answer the next requests with, one each, before behaving again."""
    lock: threading.Lock = field(default_factory=threading.Lock)


def node_object(
    name: str, instance_group: str, *, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """A HyperPod node as the API server returns it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "sagemaker.amazonaws.com/instance-group-name": instance_group,
                "sagemaker.amazonaws.com/node-health-status": "Schedulable",
                **(labels or {}),
            },
            "annotations": {},
        },
        "spec": {"providerID": f"aws:///us-east-1a/{name.removeprefix('hyperpod-')}"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod_object(name: str, namespace: str, node_name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A running training pod scheduled on ``node_name``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "pytorch", "image": "training:latest"}],
        },
        "status": {"phase": "Running"},
    }


class _Handler(BaseHTTPRequestHandler):
    server: _KubeServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the requests are recorded in the state instead."""

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": reason,
                "message": message,
                "code": code,
            },
        )

    def _handle(self, method: str) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        url = urlparse(self.path)
        with state.lock:
            state.requests.append(
                {
                    "method": method,
                    "path": url.path,
                    "query": parse_qs(url.query),
                    "content_type": self.headers.get("Content-Type"),
                    "authorization": self.headers.get("Authorization", ""),
                    "body": body,
                }
            )
            if state.down:
                return self._status(503, "ServiceUnavailable", "the API server is unavailable")
            if state.fail_next:
                code = state.fail_next.pop(0)
                return self._status(code, "InternalError", f"injected HTTP {code}")
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not token.startswith(TOKEN_PREFIX) or len(token) <= len(TOKEN_PREFIX):
                return self._status(401, "Unauthorized", "an EKS bearer token is required")
            return self._route(method, url.path, parse_qs(url.query), body)

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> None:
        state = self.server.state
        parts = [p for p in path.split("/") if p]
        if parts[:2] != ["api", "v1"]:
            return self._status(404, "NotFound", f"no route {path}")
        rest = parts[2:]
        if rest == ["nodes"] and method == "GET":
            return self._reply(
                200,
                {
                    "kind": "NodeList",
                    "apiVersion": "v1",
                    "metadata": {},
                    "items": list(state.nodes.values()),
                },
            )
        if len(rest) == 2 and rest[0] == "nodes":
            node = state.nodes.get(rest[1])
            if node is None:
                return self._status(404, "NotFound", f'nodes "{rest[1]}" not found')
            if method == "PATCH":
                if not isinstance(body, dict):
                    return self._status(400, "BadRequest", "the patch must be a JSON object")
                _merge(node, body)
            return self._reply(200, node)
        if rest == ["pods"] and method == "GET":
            return self._reply(200, self._pod_list(list(state.pods.values()), query))
        if len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "pods":
            pods = [p for (ns, _), p in state.pods.items() if ns == rest[1]]
            return self._reply(200, self._pod_list(pods, query))
        if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "pods":
            pod = state.pods.get((rest[1], rest[3]))
            if pod is None:
                return self._status(404, "NotFound", f'pods "{rest[3]}" not found')
            return self._reply(200, pod)
        return self._status(404, "NotFound", f"no route {method} {path}")

    @staticmethod
    def _pod_list(pods: list[dict[str, Any]], query: dict[str, list[str]]) -> dict[str, Any]:
        """Filter by labelSelector (k=v,...) and fieldSelector (metadata.name / spec.nodeName)."""

        def matches(pod: dict[str, Any]) -> bool:
            for selector in query.get("labelSelector", []):
                for term in filter(None, selector.split(",")):
                    key, _, value = term.partition("=")
                    if pod["metadata"]["labels"].get(key) != value:
                        return False
            for selector in query.get("fieldSelector", []):
                for term in filter(None, selector.split(",")):
                    key, _, value = term.partition("=")
                    actual = {
                        "metadata.name": pod["metadata"]["name"],
                        "spec.nodeName": pod["spec"]["nodeName"],
                        "metadata.namespace": pod["metadata"]["namespace"],
                    }.get(key)
                    if actual != value:
                        return False
            return True

        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": [p for p in pods if matches(p)],
        }

    def do_GET(self) -> None:
        """Read a node or pod, or list them."""
        self._handle("GET")

    def do_PATCH(self) -> None:
        """Patch a node."""
        self._handle("PATCH")


class _KubeServer(ThreadingHTTPServer):
    daemon_threads = True
    state: KubeState


class LocalKubernetes:
    """Start with ``with LocalKubernetes() as kube:``; ``kube.endpoint`` and ``kube.ca_data``
    are what the Lambdas' endpoint configuration (K8S_API_ENDPOINT, K8S_API_CA_DATA) takes."""

    def __init__(self) -> None:
        """Prepare the state and TLS material; :meth:`start` opens the port."""
        self.state = KubeState()
        self._tmp = tempfile.TemporaryDirectory(prefix="sdc-kube-")
        self._context, self.ca_data = _self_signed_tls(Path(self._tmp.name))
        self._server: _KubeServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        """https://127.0.0.1:<port>"""
        if self._server is None:
            raise RuntimeError("LocalKubernetes is not started")
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LocalKubernetes:
        """Serve on a free loopback port in a daemon thread."""
        server = _KubeServer(("127.0.0.1", 0), _Handler)
        server.state = self.state
        server.socket = self._context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="local-kube", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the port and remove the TLS files."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._tmp.cleanup()

    def __enter__(self) -> LocalKubernetes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------- fixtures and inspection
    def add_node(self, name: str, instance_group: str = "workers") -> None:
        """Register a node (HyperPod names nodes hyperpod-<instance id>)."""
        with self.state.lock:
            self.state.nodes[name] = node_object(name, instance_group)

    def remove_node(self, name: str) -> None:
        """Forget a node (HyperPod replaced it)."""
        with self.state.lock:
            self.state.nodes.pop(name, None)

    def add_pod(
        self,
        name: str,
        node_name: str,
        *,
        namespace: str = "default",
        labels: dict[str, str] | None = None,
    ) -> None:
        """Schedule a pod on a node."""
        with self.state.lock:
            self.state.pods[(namespace, name)] = pod_object(
                name, namespace, node_name, labels or {}
            )

    def node(self, name: str) -> dict[str, Any]:
        """A copy of the node as it is now."""
        with self.state.lock:
            return copy.deepcopy(self.state.nodes[name])

    def patches(self) -> list[dict[str, Any]]:
        """Every PATCH request received, in order."""
        with self.state.lock:
            return [r for r in self.state.requests if r["method"] == "PATCH"]
