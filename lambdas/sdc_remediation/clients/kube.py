"""The Kubernetes API of the EKS cluster: bearer token, TLS, and the few calls the workflow makes.

Authentication is the EKS IAM scheme: a presigned STS GetCallerIdentity URL carrying the header
``x-k8s-aws-id: <cluster>``, base64url-encoded after ``k8s-aws-v1.``. The endpoint and CA come from
eks:DescribeCluster; ``K8S_API_ENDPOINT`` / ``K8S_API_CA_DATA`` override them (a private endpoint
proxy, or a local stand-in). TLS is always verified against that CA.

Responses are plain JSON dicts with the API's own field names, and every failure is mapped to a
typed error here and nowhere else.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import tempfile
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from typing import Any

import boto3
import urllib3
from botocore.signers import RequestSigner

from sdc_contract.names import is_job_name, is_label_key, is_label_name, is_subdomain_name

from .. import aws
from ..clock import parse_iso
from ..config import Settings
from ..errors import (
    ClusterApiUnavailable,
    ConfigurationError,
    InvalidStepInput,
    NodeNotFound,
)

TOKEN_PREFIX = "k8s-aws-v1."
_TOKEN_TTL_SECONDS = 60
# (connect, read) seconds: a Lambda has minutes, but a stuck API should fail fast and be retried
# by the workflow rather than eat the function's whole timeout.
REQUEST_TIMEOUT = (5.0, 15.0)
LIST_PAGE_SIZE = 100
LIST_MAX_PAGES = 10
"""A job's pods on one node are a handful; the pages bound what a list may cost."""


def _segment(kind: str, name: str, valid: bool) -> str:
    """One URL path segment: validated, then escaped with nothing left safe (no ``/``)."""
    if not valid:
        raise InvalidStepInput(f"{kind} name {name!r} is not a valid Kubernetes name")
    return urllib.parse.quote(name, safe="")


def eks_token(cluster_name: str, session: boto3.session.Session | None = None) -> str:
    """A bearer token for the EKS cluster ``cluster_name`` from the caller's IAM identity."""
    session = session or aws.session()
    region = session.region_name or os.environ.get("AWS_REGION") or "us-east-1"
    sts = session.client("sts", region_name=region)
    credentials = session.get_credentials()
    if credentials is None:
        raise ConfigurationError("no AWS credentials available to sign the EKS token")
    signer = RequestSigner(
        sts.meta.service_model.service_id,
        region,
        "sts",
        "v4",
        credentials,
        session.events,
    )
    params = {
        "method": "GET",
        # The EKS authenticator accepts the regional STS endpoint; the URL is signed, never sent.
        "url": f"https://sts.{region}.amazonaws.com/?Action=GetCallerIdentity&Version=2011-06-15",
        "body": {},
        "headers": {"x-k8s-aws-id": cluster_name},
        "context": {},
    }
    url = signer.generate_presigned_url(
        params, region_name=region, expires_in=_TOKEN_TTL_SECONDS, operation_name=""
    )
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def _ca_file(ca_data_b64: str) -> str:
    """Write the base64 PEM bundle to a file once per content (the client wants a path).

    A file already at that path is used only when it holds exactly this bundle: the temporary
    directory is shared, and a CA planted there would let anyone in the middle pose as the
    cluster. Otherwise it is replaced atomically (a private temporary file, then a rename).
    """
    try:
        pem = base64.b64decode(ca_data_b64, validate=True)
    except ValueError:
        raise ConfigurationError("the Kubernetes CA data is not valid base64") from None
    digest = hashlib.sha256(pem).hexdigest()[:16]
    directory = tempfile.gettempdir()
    path = os.path.join(directory, f"sdc-k8s-ca-{digest}.pem")
    try:
        with open(path, "rb") as fh:
            if fh.read(len(pem) + 1) == pem:
                return path
    except OSError:
        pass  # absent or unreadable: write our own
    fd, staged = tempfile.mkstemp(dir=directory, prefix="sdc-k8s-ca-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise
    return path


def _endpoint_and_ca(settings: Settings) -> tuple[str, str]:
    """The API endpoint and base64 CA: the overrides where set, else eks:DescribeCluster."""
    endpoint, ca_data = settings.k8s_api_endpoint, settings.k8s_api_ca_data
    if endpoint and ca_data:
        return endpoint, ca_data
    name = settings.eks_cluster_name
    eks = aws.client("eks")
    with aws.aws_errors("eks:DescribeCluster"):
        try:
            cluster = eks.describe_cluster(name=name)["cluster"]
        except eks.exceptions.ResourceNotFoundException:
            raise ConfigurationError(f"EKS cluster {name!r} (EKS_CLUSTER_NAME) not found") from None
    endpoint = endpoint or cluster.get("endpoint")
    ca_data = ca_data or cluster.get("certificateAuthority", {}).get("data")
    if not endpoint or not ca_data:
        raise ConfigurationError(f"EKS cluster {name!r} has no endpoint or CA yet")
    return endpoint, ca_data


class KubeApi:
    """The few Kubernetes calls the workflow makes, with errors mapped to typed ones.

    Nodes (get, patch), pods (get, list) and the node screen's batch/v1 Jobs (create, get,
    delete, their pods). Plain urllib3 rather than the generated ``kubernetes`` client: a few
    REST calls do not need it, and its wrapper turns a TLS failure into an AttributeError (it
    decodes a None body), which would hide the one error that must never look transient.
    """

    def __init__(self, endpoint: str, ca_file: str, token: str) -> None:
        self._base = endpoint.rstrip("/")
        self._token = token
        self._http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED",
            ca_certs=ca_file,
            # No urllib3-level retries: the workflow retries ClusterApiUnavailable with backoff,
            # and a PATCH must not be silently resent.
            retries=False,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> KubeApi:
        """Connect to the cluster of ``EKS_CLUSTER_NAME`` with a fresh token."""
        endpoint, ca_data = _endpoint_and_ca(settings)
        return cls(endpoint, _ca_file(ca_data), eks_token(settings.eks_cluster_name))

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
        *,
        content_type: str = "application/strategic-merge-patch+json",
        exists: Callable[[], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One request; ``exists`` answers a 409 (AlreadyExists: a create retried after its
        first answer was lost) instead of raising, for a create only."""
        url = self._base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        try:
            resp = self._http.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(connect=REQUEST_TIMEOUT[0], read=REQUEST_TIMEOUT[1]),
            )
        except urllib3.exceptions.SSLError as exc:
            raise ConfigurationError(
                f"{what}: TLS verification of the Kubernetes API failed: {exc}"
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None)
            if isinstance(reason, urllib3.exceptions.SSLError):
                raise ConfigurationError(
                    f"{what}: TLS verification of the Kubernetes API failed: {reason}"
                ) from exc
            raise ClusterApiUnavailable(
                f"{what}: Kubernetes API unreachable: {reason or exc}"
            ) from exc
        status = resp.status
        if 200 <= status < 300:
            return json.loads(resp.data or b"{}")
        if status == 404:
            raise NodeNotFound(f"{what}: not found in Kubernetes (404)")
        if status == 409 and exists is not None:
            return exists()
        if status in (401, 403):
            raise ConfigurationError(
                f"{what}: Kubernetes denied the request ({status}); check the EKS access entry "
                "and RBAC of the function's role"
            )
        if status >= 500 or status in (409, 429):
            raise ClusterApiUnavailable(f"{what}: Kubernetes answered {status}")
        raise InvalidStepInput(
            f"{what}: Kubernetes rejected the request ({status}): {resp.data[:300]!r}"
        )

    @staticmethod
    def _node_path(name: str) -> str:
        return "/api/v1/nodes/" + _segment("node", name, is_subdomain_name(name))

    def get_node(self, name: str) -> dict[str, Any]:
        """The node object (raises NodeNotFound on 404, InvalidStepInput on a bad name)."""
        return self._call(f"get node {name!r}", "GET", self._node_path(name))

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Strategic-merge PATCH of a node (a ``None`` label value removes the label)."""
        return self._call(f"patch node {name!r}", "PATCH", self._node_path(name), body)

    @staticmethod
    def _pods_path(namespace: str) -> str:
        return (
            "/api/v1/namespaces/"
            + _segment("namespace", namespace, is_label_name(namespace))
            + "/pods"
        )

    def get_pod(self, pod_name: str, namespace: str = "default") -> dict[str, Any]:
        """The pod ``namespace/pod_name`` (NodeNotFound on 404).

        Looked up in that namespace only: a pod of the same name in another namespace is
        somebody else's workload, not the job's.
        """
        path = (
            self._pods_path(namespace)
            + "/"
            + _segment("pod", pod_name, is_subdomain_name(pod_name))
        )
        return self._call(f"get pod {namespace}/{pod_name}", "GET", path)

    def list_pods(
        self, namespace: str, *, label_selector: dict[str, str], node_name: str | None
    ) -> list[dict[str, Any]]:
        """The pods in ``namespace`` carrying every label of ``label_selector`` (equality) and
        scheduled on ``node_name`` (any node when None): the API's ``labelSelector`` and
        ``fieldSelector`` on ``spec.nodeName``, so the server does the filtering, following
        ``continue`` tokens.

        Every key and value is validated first (a label key, a label value, a node name): the
        selectors are built from a report's job name.
        """
        for key, value in label_selector.items():
            if not is_label_key(key) or not is_job_name(value):
                raise InvalidStepInput(f"label selector {key}={value!r} is not a valid selector")
        if node_name is not None and not is_subdomain_name(node_name):
            raise InvalidStepInput(f"node name {node_name!r} is not a valid Kubernetes name")
        query = {
            "labelSelector": ",".join(f"{k}={v}" for k, v in sorted(label_selector.items())),
            "limit": str(LIST_PAGE_SIZE),
        }
        if node_name is not None:
            query["fieldSelector"] = f"spec.nodeName={node_name}"
        what = f"list pods in {namespace} on {node_name or 'any node'}"
        pods: list[dict[str, Any]] = []
        for _ in range(LIST_MAX_PAGES):
            page = self._call(what, "GET", self._pods_path(namespace), query=query)
            pods.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return pods
            query = {**query, "continue": token}
        return pods

    def list_nodes(self) -> list[dict[str, Any]]:
        """Every node of the cluster (following ``continue`` tokens, at most
        ``LIST_MAX_PAGES`` pages: the idle screener's candidates)."""
        return self._list("list nodes", "/api/v1/nodes", {})

    def pods_on_node(self, node_name: str) -> list[dict[str, Any]]:
        """Every pod of every namespace scheduled on ``node_name`` (``fieldSelector`` on
        ``spec.nodeName``, so the server filters): what the idle screener checks for a
        training pod before a screen starts and before its result counts."""
        if not is_subdomain_name(node_name):
            raise InvalidStepInput(f"node name {node_name!r} is not a valid Kubernetes name")
        return self._list(
            f"list pods on {node_name}",
            "/api/v1/pods",
            {"fieldSelector": f"spec.nodeName={node_name}"},
        )

    def _list(self, what: str, path: str, query: dict[str, str]) -> list[dict[str, Any]]:
        """A list call's items across its pages (``limit`` and ``continue``)."""
        query = {**query, "limit": str(LIST_PAGE_SIZE)}
        items: list[dict[str, Any]] = []
        for _ in range(LIST_MAX_PAGES):
            page = self._call(what, "GET", path, query=query)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {**query, "continue": token}
        return items

    # -- batch/v1 Jobs (the node screen) ---------------------------------------------------------

    @staticmethod
    def _jobs_path(namespace: str) -> str:
        return (
            "/apis/batch/v1/namespaces/"
            + _segment("namespace", namespace, is_label_name(namespace))
            + "/jobs"
        )

    def _job_path(self, namespace: str, name: str) -> str:
        return self._jobs_path(namespace) + "/" + _segment("job", name, is_label_name(name))

    def create_job(self, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
        """Create the Job ``job`` (a batch/v1 manifest) in ``namespace``; a Job of that name
        already there (a retried create) is returned as it is (GET), never created twice."""
        name = str((job.get("metadata") or {}).get("name") or "")
        return self._call(
            f"create job {namespace}/{name}",
            "POST",
            self._jobs_path(namespace),
            job,
            content_type="application/json",
            exists=lambda: self.get_job(namespace, name),
        )

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """The Job ``namespace/name`` (NodeNotFound on 404)."""
        return self._call(f"get job {namespace}/{name}", "GET", self._job_path(namespace, name))

    def delete_job(self, namespace: str, name: str) -> bool:
        """Delete the Job and, in the background, its pods (``propagationPolicy: Background``:
        without it the API leaves the pods orphaned); False when it was already gone."""
        try:
            self._call(
                f"delete job {namespace}/{name}",
                "DELETE",
                self._job_path(namespace, name),
                {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                content_type="application/json",
            )
        except NodeNotFound:
            return False
        return True

    def job_pods(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        """The pods of the Job ``job_name`` (the ``job-name`` label the Job controller sets)."""
        return self.list_pods(namespace, label_selector={JOB_NAME_LABEL: job_name}, node_name=None)


JOB_NAME_LABEL = "job-name"
"""The label the Job controller puts on every pod of a Job (and ``batch.kubernetes.io/job-name``
since Kubernetes 1.27; both are set)."""


TRAINING_OWNER_KINDS = frozenset(
    {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob", "TrainJob"}
)
"""The training operators' job kinds (Kubeflow's ``kubeflow.org`` and ``trainer.kubeflow.org``)
whose controller owner reference on a pod names the job that created it."""
TRAINING_OWNER_GROUPS = ("kubeflow.org/", "trainer.kubeflow.org/")


def _moment(value: Any) -> datetime | None:
    """An API timestamp, or None when absent or not a time."""
    if not value:
        return None
    try:
        return parse_iso(str(value))
    except ValueError:
        return None


def pod_ran_since(pod: dict[str, Any], since: datetime) -> bool:
    """Whether ``pod`` ran: phase ``Running``, or ended (``Succeeded``/``Failed``) with a start
    time (``status.startTime``) and a container that started (its ``state.terminated`` has a
    ``startedAt``, not before the pod's start) and finished at or after ``since``.

    A pod that is ``Pending`` (an image that never pulls, a pod bound to a node by
    ``spec.nodeName`` that the kubelet never ran) or ``Unknown`` used nothing on the node, and
    an ended pod whose containers never started did not either: none of them is proof that the
    job ran there, whatever its labels say.
    """
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Running":
        return True
    if phase not in ("Succeeded", "Failed"):
        return False
    started = _moment(status.get("startTime"))
    if started is None:
        return False
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        began, ended = _moment(terminated.get("startedAt")), _moment(terminated.get("finishedAt"))
        if began is not None and ended is not None and began >= started and ended >= since:
            return True
    return False


def training_owner(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the pod's controller owner reference when it is a training operator's
    job (``TRAINING_OWNER_KINDS`` of the Kubeflow API groups), else None (a bare pod, or one a
    ReplicaSet, Job or JobSet controls)."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        api_version = str(ref.get("apiVersion") or "")
        kind = str(ref.get("kind") or "")
        if kind in TRAINING_OWNER_KINDS and api_version.startswith(TRAINING_OWNER_GROUPS):
            return kind, str(ref.get("name") or "")
        return None
    return None


def node_labels(node: dict[str, Any]) -> dict[str, str]:
    """A node object's labels (empty when none)."""
    return dict((node.get("metadata") or {}).get("labels") or {})


def node_unschedulable(node: dict[str, Any]) -> bool:
    """Whether the node is cordoned."""
    return bool((node.get("spec") or {}).get("unschedulable"))
