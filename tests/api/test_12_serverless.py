"""API reference §12, `composer_replication.diloco.serverless`: `ReplicaHandle`, the `ServerlessExecutor`
protocol, and every executor backend following it (§12 .modal, .hf_jobs; §15 .eks, .sagemaker)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from ._helpers import (
    check_dataclass,
    check_same_object,
    check_signature,
    compile_stub,
    sig_id,
    signature_problems,
)

# §12 diloco.serverless (the reference is cut off inside ``collect``: its known prefix is pinned)
_EXE = "composer_replication.diloco.serverless.executor"
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        _EXE,
        "ServerlessExecutor.launch_replicas",
        """
        def launch_replicas(
         self,
         n_replicas: int,
         entrypoint: str | Callable[..., Any],
         entrypoint_args: Mapping[str, Any],
         *,
         gpu: str | None = None,
         timeout: int = 3600,
        ) -> list[ReplicaHandle]
        """,
        "def",
    ),
    (_EXE, "ServerlessExecutor.poll", "def poll(self, handle: ReplicaHandle) -> str", "def"),
    (
        _EXE,
        "ServerlessExecutor.stream_logs",
        "def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str",
        "def",
    ),
    (_EXE, "ServerlessExecutor.cancel", "def cancel(self, handle: ReplicaHandle) -> None", "def"),
    (
        _EXE,
        "ServerlessExecutor.collect",
        "def collect(self, handles: list[ReplicaHandle], *, timeout: int | None = None)",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


# Every executor backend (§12 .modal, .hf_jobs; §15 .eks, .sagemaker; the local one) implements the
# protocol's methods with the protocol's signatures.
_PROTOCOL_METHODS = [row for row in SIGNATURES if row[1].startswith("ServerlessExecutor.")]
_BACKEND_MODULES = ["local_process", "modal", "hf_jobs", "eks", "sagemaker"]


def _executor_classes(module_name: str) -> list[type]:
    module = importlib.import_module(f"composer_replication.diloco.serverless.{module_name}")
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and callable(getattr(obj, "launch_replicas", None))
    ]
    assert found, f"{module.__name__} defines no executor class (one with launch_replicas)"
    return found


@pytest.mark.parametrize("backend", _BACKEND_MODULES)
def test_executor_backends_follow_the_protocol(backend):
    exe_module = importlib.import_module(_EXE)
    problems = []
    for cls in _executor_classes(backend):
        for _, qualname, reference, _ in _PROTOCOL_METHODS:
            method = qualname.split(".", 1)[1]
            stub = compile_stub(exe_module, reference)
            found = signature_problems(inspect.signature(getattr(cls, method)), inspect.signature(stub))
            problems += [f"{cls.__name__}.{method}: {p}" for p in found]
        for attr in ("backend_name", "supports_inter_replica_network"):
            if not hasattr(cls, attr):
                problems.append(f"{cls.__name__}.{attr} is missing (a class attribute)")
    assert not problems, "\n  ".join(problems)


DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.diloco.serverless.executor",
        "ReplicaHandle",
        """
        @dataclass
        class ReplicaHandle:
         rank: int
         backend_name: str
         metadata: dict[str, Any] = field(default_factory=dict)
        """,
    ),
]


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    check_dataclass(row)


SAME_OBJECT: list[tuple[str, str, str]] = [
    ("composer_replication.diloco.serverless", "ReplicaHandle", _EXE),
    ("composer_replication.diloco.serverless", "ServerlessExecutor", _EXE),
]


@pytest.mark.parametrize("row", SAME_OBJECT, ids=lambda r: f"{r[0]}.{r[1]}")
def test_same_object(row):
    check_same_object(row)


MODULES = [
    "composer_replication.diloco.serverless",
    "composer_replication.diloco.serverless.executor",
    "composer_replication.diloco.serverless.allreduce",
    "composer_replication.diloco.serverless.modal",
    "composer_replication.diloco.serverless.hf_jobs",
    "composer_replication.diloco.serverless.replica_entrypoint",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_serverless_executor_protocol():
    from composer_replication.diloco.serverless.executor import ServerlessExecutor

    assert getattr(ServerlessExecutor, "_is_runtime_protocol", False), "must be @runtime_checkable"
    hints = ServerlessExecutor.__annotations__
    assert {"backend_name", "supports_inter_replica_network"} <= set(hints), hints
