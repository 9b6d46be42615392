"""The one dispatch from a name to an implementation: executors by backend, object stores by ``type``.

Kept apart from the protocols (:mod:`.executor`, :mod:`.store`) so that a protocol never imports its
implementations. Each implementation module is imported only when it is asked for, so an SDK loads
only for the backend in use.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from composer_replication.diloco.serverless.executor import ServerlessExecutor
from composer_replication.diloco.serverless.store import ObjectStore

__all__ = ["BACKENDS", "STORES", "get_executor", "make_store"]

_PACKAGE = "composer_replication.diloco.serverless"

# backend name -> (module, class, pip extra)
BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "local": ("local_process", "LocalProcessExecutor", None),
    "modal": ("modal", "ModalExecutor", "modal"),
    "hf-jobs": ("hf_jobs", "HFJobsExecutor", "hf-jobs"),
    "sagemaker": ("sagemaker", "SageMakerExecutor", "sagemaker"),
    "eks": ("eks", "EKSExecutor", "eks"),
}

# store type -> (module, class)
STORES: dict[str, tuple[str, str]] = {
    "local": ("store_local", "LocalDirStore"),
    "s3": ("store_s3", "S3Store"),
}


def get_executor(backend: str, **options: Any) -> ServerlessExecutor:
    """Build the executor for ``backend`` (``local``, ``modal``, ``hf-jobs``, ``sagemaker``, ``eks``)."""
    key = backend.replace("_", "-")
    if key == "local-process":
        key = "local"
    if key not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from: {', '.join(BACKENDS)}")
    module, cls, _ = BACKENDS[key]
    return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), cls)(**options)


def make_store(cfg: Mapping[str, Any] | ObjectStore) -> ObjectStore:
    """Build a store from ``{"type": "local"|"s3", ...}`` (or pass a store through)."""
    if isinstance(cfg, ObjectStore):
        return cfg
    kind = cfg.get("type")
    if kind not in STORES:
        raise ValueError(
            f"store type {kind!r} is not one of {', '.join(map(repr, STORES))} (set store.type in the config)"
        )
    module, cls = STORES[kind]
    args = {k: v for k, v in cfg.items() if k != "type"}
    return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), cls)(**args)
