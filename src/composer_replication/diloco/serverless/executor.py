"""The executor protocol (API reference §12) and the one dispatch on a backend name.

An executor starts N replicas of an entrypoint somewhere (local processes, Modal, HF Jobs,
SageMaker, Kubernetes), reports their state, shows their logs, cancels them and collects their
results. Every backend lives in its own module and imports its SDK lazily.

Entrypoints are named ``"package.module:function"``; the function is called as
``function(entrypoint_args, rank=R, world_size=N)`` and returns a JSON-able result. The default is
:func:`composer_replication.diloco.serverless.replica_entrypoint.run_replica`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ReplicaHandle",
    "ReplicaResult",
    "ServerlessExecutor",
    "ReplicaFailedError",
    "BACKENDS",
    "DEFAULT_ENTRYPOINT",
    "TERMINAL_STATES",
    "get_executor",
    "entrypoint_name",
]

DEFAULT_ENTRYPOINT = "composer_replication.diloco.serverless.replica_entrypoint:run_replica"

# Normalised replica states; each backend maps its own vocabulary onto these.
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass
class ReplicaHandle:
    """Opaque handle returned by ``ServerlessExecutor.launch_replicas``; ``metadata`` is backend-specific."""

    rank: int
    backend_name: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplicaResult:
    """What ``collect`` returns per replica: its final state, its entrypoint's result, or the error."""

    rank: int
    state: str
    value: Any = None
    error: str | None = None


class ReplicaFailedError(RuntimeError):
    """Raised by ``collect(..., raise_on_failure=True)`` when a replica failed or was cancelled."""


@runtime_checkable
class ServerlessExecutor(Protocol):
    backend_name: str
    supports_inter_replica_network: bool

    def launch_replicas(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[ReplicaHandle]: ...

    def poll(self, handle: ReplicaHandle) -> str:
        """One of ``pending``, ``running``, ``succeeded``, ``failed``, ``cancelled``, ``unknown``."""
        ...

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str: ...

    def cancel(self, handle: ReplicaHandle) -> None: ...

    def collect(self, handles: list[ReplicaHandle], *, timeout: int | None = None) -> list[ReplicaResult]:
        """Wait for every replica to finish (``TimeoutError`` after ``timeout`` s); results in rank order."""
        ...


def entrypoint_name(entrypoint: str | Callable[..., Any]) -> str:
    """``"module:function"`` for a callable or a string; the form every backend ships to its replicas."""
    if callable(entrypoint):
        module, qual = entrypoint.__module__, entrypoint.__qualname__
        if "<" in qual or module == "__main__":
            raise ValueError(
                f"entrypoint {qual!r} must be a module-level function importable by the replicas "
                "(not a lambda, a closure or a function in __main__)"
            )
        return f"{module}:{qual}"
    if ":" not in entrypoint:
        raise ValueError(f"entrypoint {entrypoint!r} must look like 'package.module:function'")
    return entrypoint


def resolve_entrypoint(name: str) -> Callable[..., Any]:
    import importlib

    module, _, func = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in func.split("."):
        obj = getattr(obj, part)
    return obj


# backend name -> (module, class, pip extra)
BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "local": ("local_process", "LocalProcessExecutor", None),
    "modal": ("modal", "ModalExecutor", "modal"),
    "hf-jobs": ("hf_jobs", "HFJobsExecutor", "hf-jobs"),
    "sagemaker": ("sagemaker", "SageMakerExecutor", "sagemaker"),
    "eks": ("eks", "EKSExecutor", "eks"),
}


def get_executor(backend: str, **options: Any) -> ServerlessExecutor:
    """Build the executor for ``backend`` (``local``, ``modal``, ``hf-jobs``, ``sagemaker``, ``eks``)."""
    import importlib

    key = backend.replace("_", "-")
    if key == "local-process":
        key = "local"
    if key not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from: {', '.join(BACKENDS)}")
    module, cls, _ = BACKENDS[key]
    mod = importlib.import_module(f"composer_replication.diloco.serverless.{module}")
    return getattr(mod, cls)(**options)
