"""Kubernetes / EKS executor: the N replicas as one Indexed Job (extra ``eks``).

What is covered: a ``batch/v1`` Job with ``completionMode: Indexed``, ``completions = parallelism =
N``, ``restartPolicy: Never`` and per-index retries, plus a headless Service so that pods reach each
other as ``<job>-<index>.<job>`` (torchft works on a cluster; the object store works everywhere).
Each pod learns its rank from ``JOB_COMPLETION_INDEX``. Built from the Kubernetes client's models,
created with ``BatchV1Api.create_namespaced_job``; state and logs from the pod of each index.

What is not covered: cluster access (your kubeconfig or in-cluster credentials), GPU node pools and
quotas (Kueue), image builds; ``cancel`` deletes the whole Job, since the replicas of an Indexed Job
share one lifecycle.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from composer_replication.diloco.serverless.executor import ReplicaHandle, ReplicaResult, entrypoint_name
from composer_replication.diloco.serverless.hf_jobs import _last_json

__all__ = ["EKSExecutor"]

_PHASE = {"Pending": "pending", "Running": "running", "Succeeded": "succeeded", "Failed": "failed"}


def _k8s() -> Any:
    try:
        from kubernetes import client
    except ImportError as exc:
        raise ImportError(
            "the eks backend needs the kubernetes client: pip install 'composer-replication[eks]'"
        ) from exc
    return client


class EKSExecutor:
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
    ) -> None:
        self.image, self.namespace, self.job_name = image, namespace, job_name
        self.gpu_resource, self.backoff_limit_per_index, self.secret_name = (
            gpu_resource,
            backoff_limit_per_index,
            secret_name,
        )
        self._load_config = load_config

    def build(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> tuple[Any, Any]:
        """The ``V1Job`` and its headless ``V1Service`` (``--dry-run`` prints them serialised)."""
        c = _k8s()
        labels = {"app.kubernetes.io/name": "composer-replication", "composer-replication/run": self.job_name}
        limits = {self.gpu_resource: str(int(gpu))} if gpu else None
        container = c.V1Container(
            name="replica",
            image=self.image,
            command=["python", "-m", "composer_replication.diloco.serverless.replica_entrypoint"],
            args=[
                "--entrypoint",
                entrypoint_name(entrypoint),
                "--config-json",
                json.dumps(dict(entrypoint_args), sort_keys=True),
                "--world-size",
                str(n_replicas),
            ],  # fmt: skip
            env=[
                c.V1EnvVar(name="WORLD_SIZE", value=str(n_replicas)),
                c.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
            ],
            env_from=[c.V1EnvFromSource(secret_ref=c.V1SecretEnvSource(name=self.secret_name))]
            if self.secret_name
            else None,
            resources=c.V1ResourceRequirements(limits=limits) if limits else None,
        )
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
                active_deadline_seconds=int(timeout),
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

    def manifests(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        """The Job and Service as plain dicts, ready for ``kubectl apply -f``."""
        from kubernetes.client import ApiClient

        return [ApiClient().sanitize_for_serialization(o) for o in self.build(*args, **kwargs)]

    def _apis(self) -> tuple[Any, Any]:
        c = _k8s()
        if self._load_config:
            from kubernetes import config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._load_config = False
        return c.BatchV1Api(), c.CoreV1Api()

    def launch_replicas(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[ReplicaHandle]:
        job, service = self.build(n_replicas, entrypoint, entrypoint_args, gpu=gpu, timeout=timeout)
        batch, core = self._apis()
        core.create_namespaced_service(self.namespace, service)
        batch.create_namespaced_job(self.namespace, job)
        return [
            ReplicaHandle(
                rank=i,
                backend_name=self.backend_name,
                metadata={"job": self.job_name, "namespace": self.namespace},
            )
            for i in range(n_replicas)
        ]

    def _pod(self, handle: ReplicaHandle) -> Any:
        _, core = self._apis()
        pods = core.list_namespaced_pod(
            self.namespace,
            label_selector=f"job-name={self.job_name},batch.kubernetes.io/job-completion-index={handle.rank}",
        ).items
        return max(pods, key=lambda p: p.metadata.creation_timestamp) if pods else None

    def poll(self, handle: ReplicaHandle) -> str:
        pod = self._pod(handle)
        return "pending" if pod is None else _PHASE.get(pod.status.phase, "unknown")

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        pod = self._pod(handle)
        if pod is None:
            return ""
        _, core = self._apis()
        return core.read_namespaced_pod_log(pod.metadata.name, self.namespace, tail_lines=n_lines)

    def cancel(self, handle: ReplicaHandle) -> None:
        batch, core = self._apis()
        batch.delete_namespaced_job(self.job_name, self.namespace, propagation_policy="Foreground")
        core.delete_namespaced_service(self.job_name, self.namespace)

    def collect(self, handles: list[ReplicaHandle], *, timeout: int | None = None) -> list[ReplicaResult]:
        end = None if timeout is None else time.time() + timeout
        while True:
            states = {h.rank: self.poll(h) for h in handles}
            if all(s in ("succeeded", "failed") for s in states.values()):
                break
            if end is not None and time.time() > end:
                raise TimeoutError(f"Job {self.job_name} still running after {timeout}s: {states}")
            time.sleep(5)
        out = []
        for h in sorted(handles, key=lambda h: h.rank):
            logs = self.stream_logs(h, n_lines=50)
            ok = states[h.rank] == "succeeded"
            out.append(
                ReplicaResult(
                    rank=h.rank,
                    state=states[h.rank],
                    value=_last_json(logs),
                    error=None if ok else logs[-2000:],
                )
            )
        return out
