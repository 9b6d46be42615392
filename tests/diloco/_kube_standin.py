"""A loopback stand-in for the slice of the Kubernetes API that the EKS executor's client uses.

An HTTP server on 127.0.0.1 that speaks the REST paths and JSON shapes the real ``kubernetes``
client sends and parses: create/read-status/delete a Job, create/delete a Service, list pods by
label, read a pod's log, patch a pod's status (strategic merge of ``conditions`` by type) and
delete a pod. Every request is recorded. There is no scheduler or kubelet: the test moves pods
through their phases with :meth:`KubeStandIn.set_pod`. What the Job controller does on its own is
kept to the one rule the executor relies on: a deleted pod carrying a condition named by one of the
Job's ``podFailurePolicy`` ``FailIndex`` rules fails its index (``failedIndexes``) instead of being
replaced.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _indexes(indexes: set[int]) -> str | None:
    return ",".join(map(str, sorted(indexes))) or None


class KubeStandIn:
    """State (jobs, services, pods, logs) plus the server; ``url`` is what the client points at."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, str | None]] = []  # method, path, body, content type
        self.jobs: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        self.lock = threading.Lock()
        self._serial = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what a test does to the cluster -----------------------------------------------------------
    def set_pod(
        self, job: str, index: int, phase: str, *, exit_code: int | None = None, log: str = ""
    ) -> str:
        """Move the newest pod of ``index`` to ``phase`` (creating one if there is none); returns its name."""
        with self.lock:
            pod = self._newest_pod(job, index) or self._new_pod(self.jobs[job], index)
            pod["status"]["phase"] = phase
            if exit_code is not None:
                pod["status"]["containerStatuses"] = [
                    {"name": "replica", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
                     "state": {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed"}}}
                ]  # fmt: skip
            if phase == "Succeeded":
                status = self.jobs[job]["status"]
                done = {int(i) for i in (status.get("completedIndexes") or "").split(",") if i}
                status["completedIndexes"] = _indexes(done | {index})
            self.logs[pod["metadata"]["name"]] = log
            return pod["metadata"]["name"]

    def remove_pod(self, name: str) -> None:
        """The pod vanishes (garbage-collected, node lost) and nothing replaces it."""
        with self.lock:
            self.pods.pop(name, None)

    def set_job_condition(self, job: str, type_: str, reason: str, message: str) -> None:
        with self.lock:
            self.jobs[job]["status"].setdefault("conditions", []).append(
                {"type": type_, "status": "True", "reason": reason, "message": message,
                 "lastProbeTime": _now(), "lastTransitionTime": _now()}
            )  # fmt: skip

    def delete_job_behind_the_clients_back(self, job: str) -> None:
        with self.lock:
            self._delete_job(job)

    # -- the controller's one rule ---------------------------------------------------------------
    def _new_pod(self, job: dict[str, Any], index: int) -> dict[str, Any]:
        self._serial += 1
        name = f"{job['metadata']['name']}-{index}-{self._serial:05d}"
        labels = {**job["spec"]["template"]["metadata"].get("labels", {}),
                  "job-name": job["metadata"]["name"], INDEX_LABEL: str(index)}  # fmt: skip
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "creationTimestamp": _now(),
                "uid": f"uid-{self._serial}",
            },  # fmt: skip
            "spec": copy.deepcopy(job["spec"]["template"]["spec"]),
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
        }
        self.pods[name] = pod
        return pod

    def _newest_pod(self, job: str, index: int) -> dict[str, Any] | None:
        mine = [
            p for p in self.pods.values()
            if p["metadata"]["labels"].get("job-name") == job and p["metadata"]["labels"][INDEX_LABEL] == str(index)
        ]  # fmt: skip
        return max(mine, key=lambda p: p["metadata"]["name"]) if mine else None

    def _pod_deleted(self, pod: dict[str, Any]) -> None:
        job = self.jobs.get(pod["metadata"]["labels"].get("job-name", ""))
        del self.pods[pod["metadata"]["name"]]
        if job is None:
            return
        index = int(pod["metadata"]["labels"][INDEX_LABEL])
        have = {(c["type"], c["status"]) for c in pod["status"].get("conditions", [])}
        for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules", []):
            wanted = {(c["type"], c.get("status", "True")) for c in rule.get("onPodConditions", [])}
            if rule["action"] == "FailIndex" and have & wanted:
                status = job["status"]
                failed = {int(i) for i in (status.get("failedIndexes") or "").split(",") if i}
                status["failedIndexes"] = _indexes(failed | {index})
                return
        self._new_pod(job, index)  # no rule matched: the controller replaces the pod

    def _delete_job(self, name: str) -> None:
        self.jobs.pop(name, None)
        for pod_name in [n for n, p in self.pods.items() if p["metadata"]["labels"].get("job-name") == name]:
            del self.pods[pod_name]

    # -- HTTP ------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self, what: str) -> None:
                self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "message": f"{what} not found", "reason": "NotFound", "code": 404})  # fmt: skip

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with api.lock:
                    api.requests.append((method, url.path, body, self.headers.get("Content-Type")))
                    self._route(method, url.path.strip("/").split("/"), parse_qs(url.query), body)

            def _route(self, method: str, parts: list[str], query: dict[str, list[str]], body: Any) -> None:
                # /apis/batch/v1/namespaces/NS/jobs[/NAME[/status]]
                if parts[:3] == ["apis", "batch", "v1"] and parts[5:6] == ["jobs"]:
                    name = parts[6] if len(parts) > 6 else None
                    if method == "POST":
                        body.setdefault("status", {})
                        body["metadata"].update(creationTimestamp=_now(), uid="job-uid")
                        api.jobs[body["metadata"]["name"]] = body
                        for i in range(body["spec"]["completions"]):
                            api._new_pod(body, i)
                        return self._reply(201, body)
                    if name not in api.jobs:
                        return self._not_found(f"jobs.batch {name!r}")
                    if method == "DELETE":
                        api._delete_job(name)
                        return self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                    return self._reply(200, api.jobs[name])
                # /api/v1/namespaces/NS/services[/NAME]
                if parts[:2] == ["api", "v1"] and parts[4:5] == ["services"]:
                    if method == "POST":
                        api.services[body["metadata"]["name"]] = body
                        return self._reply(201, body)
                    if api.services.pop(parts[5], None) is None:
                        return self._not_found(f"services {parts[5]!r}")
                    return self._reply(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                # /api/v1/namespaces/NS/pods[/NAME[/log|/status]]
                if parts[:2] == ["api", "v1"] and parts[4:5] == ["pods"]:
                    if len(parts) == 5:
                        wanted = dict(
                            kv.split("=", 1) for kv in query.get("labelSelector", [""])[0].split(",") if kv
                        )
                        items = [p for p in api.pods.values()
                                 if all(p["metadata"]["labels"].get(k) == v for k, v in wanted.items())]  # fmt: skip
                        return self._reply(
                            200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
                        )
                    pod = api.pods.get(parts[5])
                    if pod is None:
                        return self._not_found(f"pods {parts[5]!r}")
                    if parts[6:] == ["log"]:
                        lines = api.logs.get(parts[5], "").splitlines()
                        tail = int(query.get("tailLines", ["0"])[0]) or len(lines)
                        return self._reply(200, "\n".join(lines[-tail:]), "text/plain")
                    if parts[6:] == ["status"] and method == "PATCH":
                        conditions = pod["status"].setdefault("conditions", [])
                        for cond in body["status"]["conditions"]:  # strategic merge: by type
                            conditions[:] = [c for c in conditions if c["type"] != cond["type"]] + [cond]
                        return self._reply(200, pod)
                    if method == "DELETE":
                        api._pod_deleted(pod)
                        return self._reply(200, pod)
                    return self._reply(200, pod)
                return self._not_found("/".join(parts))

            def do_GET(self) -> None:  # noqa: N802 - http.server naming
                self._handle("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_PATCH(self) -> None:  # noqa: N802
                self._handle("PATCH")

            def do_DELETE(self) -> None:  # noqa: N802
                self._handle("DELETE")

        return Handler
