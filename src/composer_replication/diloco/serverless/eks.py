"""Kubernetes / EKS executor: the N replicas as one Indexed Job (extra ``eks``).

What is covered: a ``batch/v1`` Job with ``completionMode: Indexed``, ``completions = parallelism =
N``, ``restartPolicy: Never`` and per-index retries (``backoffLimitPerIndex``), plus a headless
Service so that pods reach each other as ``<job>-<index>.<job>`` (torchft works on a cluster; the
object store works everywhere). Each pod learns its rank from ``JOB_COMPLETION_INDEX``. Built from
the Kubernetes client's models, created with ``BatchV1Api.create_namespaced_job``.

A replica's state comes from the Job's status first (``completedIndexes``, ``failedIndexes``, the
``Complete``/``Failed`` conditions), then from the newest pod of its index. ``collect`` ends on its
own when pods are gone: a Job that no longer exists fails every unfinished replica, and an index
whose pod disappeared (and was not replaced within ``pod_gone_grace_s``) fails with that reason.
``cancel(handle)`` stops that replica only: it marks the index's pod with the condition
``ComposerReplicationCancelled`` (``pods/status`` patch) and deletes the pod; the Job's
``podFailurePolicy`` turns that condition into ``FailIndex``, so the index is not retried and the
other replicas run on. ``delete_job()`` removes the Job and the Service.

What is not covered: cluster access (your kubeconfig or in-cluster credentials; the service account
needs create/get/delete on jobs and services, list/get/delete on pods, patch on pods/status and get
on pods/log), GPU node pools and quotas (Kueue), image builds. Per-index retries and ``FailIndex``
need Kubernetes >= 1.29 (``JobBackoffLimitPerIndex``); older servers ignore them and fall back to the
Job-wide ``backoffLimit``.
"""

from __future__ import annotations

import time
from typing import Any

from composer_replication._extras import require
from composer_replication.diloco.serverless.executor import (
    ExecutorBase,
    Launch,
    ReplicaHandle,
    ReplicaResult,
    state_map,
)

__all__ = ["EKSExecutor", "CANCEL_CONDITION", "parse_indexes"]

CANCEL_CONDITION = "ComposerReplicationCancelled"
# A pod that Failed reads as pending: its Job retries it (an index out of retries, or a Job that ended, is
# read from the Job's status before the pod's phase).
_PHASE = state_map(pending=("Pending", "Failed"), running="Running", succeeded="Succeeded")
_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def _k8s() -> Any:
    require("eks", purpose="the eks backend")
    from kubernetes import client

    return client


def parse_indexes(text: str | None) -> set[int]:
    """The indexes of a Job status field such as ``"0,2-4"`` (``completedIndexes``/``failedIndexes``)."""
    out: set[int] = set()
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _pod_reason(pod: Any) -> str:
    """Why a pod ended, from its status (evicted, OOMKilled, exit code ...)."""
    st = pod.status
    bits = [f"pod {pod.metadata.name} {st.phase}"]
    if st.reason or st.message:
        bits.append(f"{st.reason or ''} {st.message or ''}".strip())
    for cs in st.container_statuses or []:
        term = cs.state.terminated if cs.state else None
        if term is not None:
            bits.append(f"container {cs.name} exit code {term.exit_code} ({term.reason or 'no reason'})")
    return ": ".join(bits)


class EKSExecutor(ExecutorBase):
    """Replicas as the indices of one Kubernetes Indexed Job."""

    backend_name = "eks"
    supports_inter_replica_network = True

    def __init__(
        self,
        *,
        image: str,
        namespace: str = "default",
        job_name: str = "diloco",
        gpu_resource: str = "nvidia.com/gpu",
        backoff_limit_per_index: int = 2,
        secret_name: str | None = None,
        load_config: bool = True,
        api_client: Any = None,
        poll_interval_s: float = 5.0,
        pod_gone_grace_s: float = 60.0,
    ) -> None:
        self.image, self.namespace, self.job_name = image, namespace, job_name
        self.gpu_resource, self.backoff_limit_per_index = gpu_resource, backoff_limit_per_index
        self.secret_name, self.api_client = secret_name, api_client
        self.poll_interval_s, self.pod_gone_grace_s = poll_interval_s, pod_gone_grace_s
        self._load_config = load_config and api_client is None
        self._cancelled: set[int] = set()
        self._seen: dict[int, tuple[str, float]] = {}  # index -> (last pod name, when last seen)
        self._reasons: dict[int, str] = {}

    def build(self, launch: Launch) -> tuple[Any, Any]:
        """The ``V1Job`` and its headless ``V1Service`` (``describe`` prints them as YAML)."""
        c = _k8s()
        labels = {"app.kubernetes.io/name": "composer-replication", "composer-replication/run": self.job_name}
        limits = {self.gpu_resource: str(int(launch.gpu))} if launch.gpu else None
        cmd, n_replicas = launch.command(), launch.n_replicas  # each pod's rank comes from its index
        container = c.V1Container(
            name="replica",
            image=self.image,
            command=cmd[:3],
            args=cmd[3:],
            env=[
                c.V1EnvVar(name="WORLD_SIZE", value=str(n_replicas)),
                c.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
            ],
            env_from=[c.V1EnvFromSource(secret_ref=c.V1SecretEnvSource(name=self.secret_name))]
            if self.secret_name
            else None,
            resources=c.V1ResourceRequirements(limits=limits) if limits else None,
        )
        cancelled = c.V1PodFailurePolicyOnPodConditionsPattern(type=CANCEL_CONDITION, status="True")
        job = c.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=c.V1ObjectMeta(name=self.job_name, namespace=self.namespace, labels=labels),
            spec=c.V1JobSpec(
                completion_mode="Indexed",
                completions=n_replicas,
                parallelism=n_replicas,
                backoff_limit_per_index=self.backoff_limit_per_index,
                max_failed_indexes=max(0, n_replicas - 1),
                pod_failure_policy=c.V1PodFailurePolicy(
                    rules=[c.V1PodFailurePolicyRule(action="FailIndex", on_pod_conditions=[cancelled])]
                ),
                active_deadline_seconds=int(launch.timeout),
                ttl_seconds_after_finished=3600,
                template=c.V1PodTemplateSpec(
                    metadata=c.V1ObjectMeta(labels=labels),
                    spec=c.V1PodSpec(restart_policy="Never", subdomain=self.job_name, containers=[container]),
                ),
            ),
        )
        service = c.V1Service(
            api_version="v1",
            kind="Service",
            metadata=c.V1ObjectMeta(name=self.job_name, namespace=self.namespace, labels=labels),
            spec=c.V1ServiceSpec(cluster_ip="None", selector={"job-name": self.job_name}),
        )
        return job, service

    def manifests(self, launch: Launch) -> list[dict[str, Any]]:
        """The Job and Service as plain dicts, ready for ``kubectl apply -f``."""
        from kubernetes.client import ApiClient

        return [ApiClient().sanitize_for_serialization(o) for o in self.build(launch)]

    def _describe(self, launch: Launch) -> str:
        """The Job and Service manifests as YAML documents."""
        import yaml

        return yaml.safe_dump_all(self.manifests(launch), sort_keys=False)

    def _apis(self) -> tuple[Any, Any]:
        c = _k8s()
        if self._load_config:
            from kubernetes import config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._load_config = False
        return c.BatchV1Api(self.api_client), c.CoreV1Api(self.api_client)

    def _launch(self, launch: Launch) -> list[ReplicaHandle]:
        job, service = self.build(launch)
        batch, core = self._apis()
        core.create_namespaced_service(self.namespace, service)
        batch.create_namespaced_job(self.namespace, job)
        meta = {"job": self.job_name, "namespace": self.namespace}
        return self._handles(dict(meta) for _ in range(launch.n_replicas))

    def _snapshot(self) -> tuple[Any, dict[int, Any]]:
        """The Job (None if it no longer exists) and the newest pod of each index."""
        from kubernetes.client.exceptions import ApiException

        batch, core = self._apis()
        try:
            job = batch.read_namespaced_job_status(self.job_name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            job = None
        pods: dict[int, Any] = {}
        for pod in core.list_namespaced_pod(self.namespace, label_selector=f"job-name={self.job_name}").items:
            index = (pod.metadata.labels or {}).get(_INDEX_LABEL, "")
            if index.isdigit():
                i = int(index)
                if i not in pods or pod.metadata.creation_timestamp > pods[i].metadata.creation_timestamp:
                    pods[i] = pod
        return job, pods

    def _state(self, rank: int, job: Any, pod: Any) -> tuple[str, str | None]:
        """(state, reason when it did not succeed) of one index."""
        where = f"Job {self.namespace}/{self.job_name}"
        if job is None:
            state = "cancelled" if rank in self._cancelled else "failed"
            return state, f"{where} no longer exists (deleted, or removed by ttlSecondsAfterFinished)"
        status = job.status
        if rank in parse_indexes(status.completed_indexes) or (
            pod is not None and pod.status.phase == "Succeeded"
        ):
            return "succeeded", None
        if pod is not None:
            self._seen[rank] = (pod.metadata.name, time.monotonic())
        if rank in self._cancelled:
            if pod is not None and pod.status.phase in ("Pending", "Running"):
                self._mark_cancelled(pod)  # a pod that appeared after cancel() was called
            return "cancelled", f"index {rank} cancelled by the launcher"
        if rank in parse_indexes(status.failed_indexes):
            return "failed", _pod_reason(pod) if pod is not None else f"index {rank} failed (retries used up)"
        for cond in status.conditions or []:
            if cond.type in ("Complete", "Failed") and cond.status == "True":
                detail = f"{cond.reason or cond.type}: {cond.message or ''}".strip(": ")
                return "failed", f"{where} ended ({detail}) before index {rank} completed"
        if pod is None:
            name, when = self._seen.get(rank, (None, None))
            if when is not None and time.monotonic() - when > self.pod_gone_grace_s:
                return "failed", f"pod {name} of index {rank} disappeared and was not replaced"
            return "pending", None
        return _PHASE.get(pod.status.phase, "unknown"), None  # Failed: a retry is on its way

    def _poll_all(self, handles: list[ReplicaHandle]) -> dict[int, str]:
        job, pods = self._snapshot()
        states = {}
        for h in handles:
            states[h.rank], reason = self._state(h.rank, job, pods.get(h.rank))
            if reason:
                self._reasons[h.rank] = reason
        return states

    def poll(self, handle: ReplicaHandle) -> str:
        return self._poll_all([handle])[handle.rank]

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        _, pods = self._snapshot()
        pod = pods.get(handle.rank)
        if pod is None:
            return ""
        from kubernetes.client.exceptions import ApiException

        _, core = self._apis()
        try:
            # raw bytes: the client's own decoding turns a text/plain body into "b'...'" (its str(bytes))
            resp = core.read_namespaced_pod_log(
                pod.metadata.name, self.namespace, tail_lines=n_lines, _preload_content=False
            )
            return resp.data.decode("utf-8", "replace")
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise

    def _mark_cancelled(self, pod: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        _, core = self._apis()
        condition = {
            "type": CANCEL_CONDITION,
            "status": "True",
            "reason": "CancelledByLauncher",
            "message": "composer-replication cancelled this replica",
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            core.patch_namespaced_pod_status(
                pod.metadata.name,
                self.namespace,
                {"status": {"conditions": [condition]}},
                _content_type="application/strategic-merge-patch+json",  # merges conditions by type
            )
            core.delete_namespaced_pod(pod.metadata.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:  # already gone: nothing left to stop
                raise

    def cancel(self, handle: ReplicaHandle) -> None:
        """Stop this replica only (its index fails without a retry); the others keep running."""
        self._cancelled.add(handle.rank)
        _, pods = self._snapshot()
        pod = pods.get(handle.rank)
        if pod is not None and pod.status.phase in ("Pending", "Running"):
            self._mark_cancelled(pod)

    def delete_job(self) -> None:
        """Delete the Job (and its pods) and the headless Service."""
        batch, core = self._apis()
        batch.delete_namespaced_job(self.job_name, self.namespace, propagation_policy="Foreground")
        core.delete_namespaced_service(self.job_name, self.namespace)

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        """Wait until every index has ended; the value is the replica's last JSON log line."""
        return self._collect_from_logs(
            handles, timeout=timeout, raise_on_failure=raise_on_failure, interval=self.poll_interval_s,
            what=f"Job {self.namespace}/{self.job_name}", poll_all=lambda: self._poll_all(handles),
            reasons=self._reasons,
        )  # fmt: skip
