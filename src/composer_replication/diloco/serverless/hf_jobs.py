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
from collections.abc import Sequence
from typing import Any

from composer_replication._extras import require
from composer_replication.diloco.serverless.executor import (
    ExecutorBase,
    Launch,
    ReplicaHandle,
    ReplicaResult,
    state_map,
)

__all__ = ["HFJobsExecutor"]

_STAGES = state_map(
    pending="SCHEDULING",
    running="RUNNING",
    succeeded="COMPLETED",
    failed="ERROR",
    cancelled=("CANCELED", "DELETED"),
)


def _hub() -> Any:
    require("hf-jobs", purpose="the hf-jobs backend")
    import huggingface_hub

    return huggingface_hub


class HFJobsExecutor(ExecutorBase):
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

    def job_specs(self, launch: Launch) -> list[dict[str, Any]]:
        """The ``run_job`` keyword arguments of every replica (what ``--dry-run`` prints, secrets by name)."""
        n = launch.n_replicas
        return [
            {
                "image": self.image,
                "command": launch.command(rank=rank, setup=self.setup),
                "env": {"REPLICA_RANK": str(rank), "WORLD_SIZE": str(n), "PYTHONUNBUFFERED": "1"},
                "secrets": sorted(k for k in self.secret_env if os.environ.get(k)),
                "flavor": launch.gpu or "cpu-basic",
                "timeout": launch.timeout,
                "labels": {"composer-replication": self.run_name, "replica-rank": str(rank)},
                "namespace": self.namespace,
            }
            for rank in range(n)
        ]

    def _describe(self, launch: Launch) -> str:
        """The ``run_job`` arguments of every replica as JSON (secrets by name, never their values)."""
        return json.dumps(self.job_specs(launch), indent=2)

    def _launch(self, launch: Launch) -> list[ReplicaHandle]:
        metadata = []
        for spec in self.job_specs(launch):
            spec = {**spec, "secrets": {k: os.environ[k] for k in spec["secrets"]} or None}
            job = self._api.run_job(**spec)
            metadata.append({"job_id": job.id, "namespace": self.namespace, "url": getattr(job, "url", None)})
        return self._handles(metadata)

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
        return self._collect_from_logs(
            handles, timeout=timeout, raise_on_failure=raise_on_failure, interval=5, what="HF Jobs"
        )
