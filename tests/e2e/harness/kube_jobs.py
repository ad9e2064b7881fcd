"""The loopback Kubernetes API stand-in (``tests.support.kube_standin``) with batch/v1 Jobs.

Adds what the Screen step calls: POST (create, 409 AlreadyExists for a name taken), GET and
DELETE (with ``DeleteOptions``: ``propagationPolicy: Background`` deletes the Job's pods too,
without it they are orphaned, as on the API server) of ``/apis/batch/v1/namespaces/<ns>/jobs``;
the Job's pods are listed by the base stand-in's pod list (label ``job-name``). A Job does not
run by itself: a test moves it on with ``run_job`` (its pod ends, with a termination message),
``job_pending`` (its pod waits, never started) and ``job_deadline_exceeded`` (the Job controller
ends it at ``activeDeadlineSeconds``). The end-to-end pipelines serve it (a stack without a
``screenImage`` never calls it), and tests/lambdas/test_screen_step.py drives it.

It extends the base stand-in from outside (the request handler class of its server is replaced
by a subclass) so the base file stays as the other tests use it.
"""

from __future__ import annotations

import copy
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.support import kube_standin
from tests.support.kube_standin import KubeStandIn

JOB_NAME_LABEL = "job-name"


@dataclass
class JobsStandIn(KubeStandIn):
    """The stand-in with Jobs; use as a context manager."""

    jobs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace, name) -> the Job object as created (with a ``status``)."""
    deleted: list[tuple[str, str, Any]] = field(default_factory=list)
    """(namespace, name, the DELETE request's body) of every Job deleted."""
    node_gpus: int = 8
    """The allocatable ``nvidia.com/gpu`` every node added gets (a p5's eight)."""
    screen_result: Callable[[dict[str, Any]], tuple[str | None, int]] | None = None
    """When set, a Job runs as soon as it is created: its pod ends with the (termination
    message, exit code) this returns for the Job (what the screen on that node wrote)."""

    def add_node(
        self, name: str, labels: dict[str, str] | None = None, unschedulable: bool = False
    ) -> None:
        """Register a node object offering ``node_gpus`` GPUs."""
        super().add_node(name, labels, unschedulable)
        gpus = {"nvidia.com/gpu": str(self.node_gpus)} if self.node_gpus else {}
        self.nodes[name]["status"] = {"allocatable": dict(gpus), "capacity": dict(gpus)}

    def __enter__(self) -> JobsStandIn:
        super().__enter__()
        # The server builds a handler per request from this class: ours adds the Jobs routes.
        self._server.RequestHandlerClass = _jobs_handler(self)
        return self

    def add_gpu_node(self, name: str, gpus: int = 8, *, unschedulable: bool = True) -> None:
        """A node with ``gpus`` allocatable ``nvidia.com/gpu``, cordoned by default."""
        self.add_node(name, unschedulable=unschedulable)
        self.nodes[name]["status"] = {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "192"},
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "192"},
        }

    @property
    def created_jobs(self) -> list[dict[str, Any]]:
        """The body of every Job create request, in order."""
        return [
            r.body
            for r in self.requests
            if r.method == "POST" and "/apis/batch/v1/" in r.path and r.path.endswith("/jobs")
        ]

    def job(self, name: str, namespace: str = "sdc-screen") -> dict[str, Any]:
        """The Job ``namespace/name`` as the stand-in holds it."""
        return self.jobs[namespace, name]

    def _job_pod(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        with self.lock:
            self.pods = [
                p
                for p in self.pods
                if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) != meta["name"]
            ]
            self.pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{meta['name']}-abcde",
                        "namespace": meta["namespace"],
                        "labels": {JOB_NAME_LABEL: meta["name"], **meta.get("labels", {})},
                    },
                    "spec": {"nodeName": node, **copy.deepcopy(spec)},
                    "status": status,
                }
            )

    def run_job(
        self,
        name: str,
        message: str | None,
        *,
        exit_code: int = 0,
        namespace: str = "sdc-screen",
    ) -> None:
        """The Job's pod ran and its container ended with ``exit_code`` and the termination
        ``message`` (None: none); the Job is Complete (exit 0) or Failed (BackoffLimitExceeded)."""
        job = self.job(name, namespace)
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:10:00Z",
        }
        if message is not None:
            terminated["message"] = message
        self._job_pod(
            job,
            {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "startTime": "2026-01-01T00:00:00Z",
                "containerStatuses": [{"name": "screen", "state": {"terminated": terminated}}],
            },
        )
        condition = (
            {"type": "Complete", "status": "True"}
            if exit_code == 0
            else {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
            }
        )
        with self.lock:
            job["status"] = {
                "conditions": [condition],
                "succeeded" if exit_code == 0 else "failed": 1,
            }

    def job_pending(
        self, name: str, namespace: str = "sdc-screen", reason: str = "ImagePullBackOff"
    ) -> None:
        """The Job's pod is bound but its container never starts (``reason``)."""
        self._job_pod(
            self.job(name, namespace),
            {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "screen",
                        "state": {
                            "waiting": {"reason": reason, "message": "back-off pulling image"}
                        },
                    }
                ],
            },
        )
        with self.lock:
            self.job(name, namespace)["status"] = {"active": 1}

    def job_running(self, name: str, namespace: str = "sdc-screen") -> None:
        """The Job's pod runs."""
        self._job_pod(
            self.job(name, namespace),
            {
                "phase": "Running",
                "startTime": "2026-01-01T00:00:00Z",
                "containerStatuses": [
                    {"name": "screen", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
                ],
            },
        )
        with self.lock:
            self.job(name, namespace)["status"] = {"active": 1}

    def job_deadline_exceeded(self, name: str, namespace: str = "sdc-screen") -> None:
        """The Job controller ended the Job at its activeDeadlineSeconds (its pods stopped)."""
        with self.lock:
            self.job(name, namespace)["status"] = {
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "Job was active longer than specified deadline",
                    }
                ],
                "failed": 1,
            }


def _jobs_handler(api: JobsStandIn) -> type:
    base = kube_standin._make_handler(api)

    class Handler(base):  # type: ignore[misc, valid-type]
        def _route(self, method: str, body: Any) -> None:
            parts = urllib.parse.urlsplit(self.path)
            segments = parts.path.strip("/").split("/")
            if segments[:4] != ["apis", "batch", "v1", "namespaces"] or len(segments) < 6:
                super()._route(method, body)
                return
            if segments[5] != "jobs" or len(segments) > 7:
                self._status(404, "NotFound")
                return
            namespace = urllib.parse.unquote(segments[4])
            if len(segments) == 6:
                if method != "POST":
                    self._status(405, "MethodNotAllowed")
                    return
                if self.headers.get("Content-Type") != "application/json":
                    self._status(415, "UnsupportedMediaType")
                    return
                name = (body or {}).get("metadata", {}).get("name", "")
                if (namespace, name) in api.jobs:
                    self._status(409, "AlreadyExists")
                    return
                job = copy.deepcopy(body)
                job["metadata"]["namespace"] = namespace
                job["metadata"]["uid"] = f"uid-{name}"
                job["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
                job["status"] = {}
                api.jobs[namespace, name] = job
                self._reply(201, job)
                if api.screen_result is not None:
                    message, code = api.screen_result(job)
                    api.run_job(name, message, exit_code=code, namespace=namespace)
                return
            name = urllib.parse.unquote(segments[6])
            job = api.jobs.get((namespace, name))
            if job is None:
                self._status(404, "NotFound")
                return
            if method == "DELETE":
                del api.jobs[namespace, name]
                api.deleted.append((namespace, name, body))
                if (body or {}).get("propagationPolicy") in ("Background", "Foreground"):
                    api.pods = [
                        p
                        for p in api.pods
                        if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) != name
                    ]
                self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                return
            self._reply(200, job)

        def do_POST(self) -> None:
            self._handle("POST")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    return Handler
