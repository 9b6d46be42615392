"""Serverless DiLoCo (API reference §12, §15): executors for local processes, Modal, HF Jobs,
SageMaker and EKS behind one protocol, and an all-reduce through an object store for replicas that
cannot reach each other.

The executors' SDKs load only when their backend is used, and torchft only for ``sync: torchft``.
"""

from __future__ import annotations

from composer_replication.diloco.serverless.executor import (
    DEFAULT_ENTRYPOINT,
    ReplicaFailedError,
    ReplicaHandle,
    ReplicaResult,
    ServerlessExecutor,
)
from composer_replication.diloco.serverless.factory import BACKENDS, get_executor

__all__ = [
    "BACKENDS",
    "DEFAULT_ENTRYPOINT",
    "ReplicaFailedError",
    "ReplicaHandle",
    "ReplicaResult",
    "ServerlessExecutor",
    "get_executor",
]
