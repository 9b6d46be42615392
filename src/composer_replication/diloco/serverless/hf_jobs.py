"""Hugging Face Jobs executor: one Job per replica, through ``huggingface_hub`` (extra ``hf-jobs``).

What is covered: starting N Jobs (``run_job``) that each run the replica entrypoint with the resolved
config inline, polling (``inspect_job``), logs (``fetch_job_logs``), cancellation (``cancel_job``).
Credentials for the object store go as HF Job *secrets*, named by ``secret_env`` and read from this
process's environment; their values are never logged or returned.

What is not covered: Jobs cannot reach each other unless they share a ``network_group``
(huggingface_hub >= 2.4), so replicas sync through the object store; this module does not provision
the store, nor cap spend: a Job bills per second of its ``flavor`` until it ends or ``timeout`` passes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from composer_replication._extras import require
from composer_replication.diloco.serverless.executor import (
    ReplicaHandle,
    ReplicaResult,
    entrypoint_name,
    finish,
    last_json,
    replica_command,
    wait_for_states,
)

__all__ = ["HFJobsExecutor"]

_STAGES = {
    "SCHEDULING": "pending",
    "RUNNING": "running",
    "COMPLETED": "succeeded",
    "ERROR": "failed",
    "CANCELED": "cancelled",
    "DELETED": "cancelled",
}


def _hub() -> Any:
    require("hf-jobs", purpose="the hf-jobs backend")
    import huggingface_hub

    return huggingface_hub


class HFJobsExecutor:
    """Replicas as Hugging Face Jobs."""

    backend_name = "hf_jobs"
    supports_inter_replica_network = False

    def __init__(
        self,
        *,
        namespace: str | None = None,
        image: str = "pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime",
        setup: str | None = "pip install --quiet 'composer-replication[torchft,s3]'",
        secret_env: Sequence[str] = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
        endpoint: str | None = None,
        token: str | None = None,
        run_name: str = "diloco",
        api: Any = None,
    ) -> None:
        self.namespace, self.image, self.setup, self.run_name = namespace, image, setup, run_name
        self.secret_env = tuple(secret_env)
        self._api = api if api is not None else _hub().HfApi(endpoint=endpoint, token=token)

    def job_specs(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[dict[str, Any]]:
        """The ``run_job`` keyword arguments of every replica (what ``--dry-run`` prints, secrets by name)."""
        name = entrypoint_name(entrypoint)
        return [
            {
                "image": self.image,
                "command": replica_command(name, entrypoint_args, n_replicas, rank=rank, setup=self.setup),
                "env": {"REPLICA_RANK": str(rank), "WORLD_SIZE": str(n_replicas), "PYTHONUNBUFFERED": "1"},
                "secrets": sorted(k for k in self.secret_env if os.environ.get(k)),
                "flavor": gpu or "cpu-basic",
                "timeout": timeout,
                "labels": {"composer-replication": self.run_name, "replica-rank": str(rank)},
                "namespace": self.namespace,
            }
            for rank in range(n_replicas)
        ]

    def describe(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> str:
        """The ``run_job`` arguments of every replica as JSON (secrets by name, never their values)."""
        specs = self.job_specs(n_replicas, entrypoint, entrypoint_args, gpu=gpu, timeout=timeout)
        return json.dumps(specs, indent=2)

    def launch_replicas(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[ReplicaHandle]:
        handles = []
        for rank, spec in enumerate(
            self.job_specs(n_replicas, entrypoint, entrypoint_args, gpu=gpu, timeout=timeout)
        ):
            spec = {**spec, "secrets": {k: os.environ[k] for k in spec["secrets"]} or None}
            job = self._api.run_job(**spec)
            handles.append(
                ReplicaHandle(
                    rank=rank,
                    backend_name=self.backend_name,
                    metadata={
                        "job_id": job.id,
                        "namespace": self.namespace,
                        "url": getattr(job, "url", None),
                    },
                )
            )
        return handles

    def poll(self, handle: ReplicaHandle) -> str:
        info = self._api.inspect_job(job_id=handle.metadata["job_id"], namespace=self.namespace)
        return _STAGES.get(str(info.status.stage), "unknown")

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        lines = self._api.fetch_job_logs(
            job_id=handle.metadata["job_id"], namespace=self.namespace, follow=False, tail=n_lines
        )
        return "\n".join(list(lines)[-n_lines:])

    def cancel(self, handle: ReplicaHandle) -> None:
        self._api.cancel_job(job_id=handle.metadata["job_id"], namespace=self.namespace)

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        """Wait for every Job; the value is the replica's last JSON log line (its ``done`` record)."""
        states = wait_for_states(
            lambda: {h.rank: self.poll(h) for h in handles}, timeout=timeout, interval=5, what="HF Jobs"
        )
        out = []
        for h in handles:
            logs = self.stream_logs(h, n_lines=50)
            ok = states[h.rank] == "succeeded"
            out.append(ReplicaResult(h.rank, states[h.rank], last_json(logs), None if ok else logs[-2000:]))
        return finish(out, raise_on_failure=raise_on_failure)
