"""The `Sandbox` protocol every backend implements, its records (`ExecResult`, `SandboxLimits`) and the
helpers the backends share. `datagen.sandbox` re-exports all of it next to the one dispatch on ``type``
(`make_sandbox`); backends import from here, so no backend module imports the dispatch that imports it.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Self, runtime_checkable

from composer_replication.datagen.policy import check_command

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxContext",
    "SandboxError",
    "SandboxLimits",
    "SandboxType",
    "check_command",
    "check_ro_binds",
    "exec_result",
    "limit_violations",
    "safe_relpath",
    "truncate_output",
]

SandboxType = Literal["bwrap", "docker", "podman"]


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, crashed, harness timeout): an *infrastructure* error.

    Rollouts catch it and label the run ``status="infra_error"``; such runs are excluded from training and
    never scored as reward 0.
    """


@dataclass
class ExecResult:
    """What one command in the sandbox did.

    ``returncode`` is -1 when the command was killed for running past its wall-clock ``timeout``
    (``timed_out=True``). ``violations`` lists policy hits (see `check_command`) and limits that fired.
    """

    output: str
    returncode: int
    timed_out: bool = False
    duration_s: float = 0.0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SandboxLimits:
    """Resource limits of a sandbox.

    ``memory_mb`` (swap included) and ``nproc`` hold for **all of a command's processes together**: a
    cgroup (bwrap as root with writable cgroups; docker ``--memory``/``--pids-limit`` for the whole
    container); where no cgroup can be made, bwrap falls back to ``memory_mb`` of address space per
    process and ``nproc`` processes per sandbox uid (`BwrapSandbox.containment` says which holds).
    ``workspace_mb`` caps what the sandbox can write: bwrap as root puts the workspace and ``/tmp`` on one
    tmpfs of that size; docker gives ``/workspace`` and ``/tmp`` a tmpfs each of that size (both counted
    in the container's memory); bwrap without root checks the workspace after each command.
    ``cpu_s`` is CPU seconds per process (RLIMIT_CPU); ``fsize_mb`` the largest file a command may write;
    ``output_bytes`` how much stdout+stderr is kept (the rest is cut, with a marker).
    """

    cpu_s: int = 30
    memory_mb: int = 1024
    nproc: int = 128
    fsize_mb: int = 64
    output_bytes: int = 64_000
    workspace_mb: int = 256


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run an agent's commands over one workspace directory.

    Use as a context manager: ``with make_sandbox("bwrap") as sb: sb.exec("ls")``. Paths given to
    `put`/`get` are relative to the workspace; absolute paths or ``..`` are refused.
    """

    workdir: str  # the workspace path as seen *inside* the sandbox

    def start(self) -> None: ...

    def exec(self, cmd: str, timeout: float = 30.0) -> ExecResult: ...

    def put(self, path: str, data: bytes | str) -> None: ...

    def get(self, path: str) -> bytes: ...

    def stop(self) -> None: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...


class SandboxContext(ABC):
    """What every backend shares: its ``limits`` and checked ``ro_binds``; ``with sandbox:`` starts it and
    stops it on the way out."""

    def __init__(self, limits: SandboxLimits | None, ro_binds: dict[str, str] | None) -> None:
        self.limits = limits or SandboxLimits()
        self.ro_binds = check_ro_binds(ro_binds)

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exec_result(
    cmd: str,
    raw: bytes,
    returncode: int,
    *,
    timed_out: bool,
    elapsed: float,
    output_bytes: int,
    fired: Sequence[str] = (),
) -> ExecResult:
    """The `ExecResult` of a finished command: its output (``raw`` cut at ``output_bytes``), ``returncode``
    (-1 when ``timed_out``) and its violations, each once, in this order: the policy's hits on ``cmd``
    (`check_command`), ``timeout``, then the limits that fired: those its output and exit code show
    (`limit_violations`) and those the backend saw (``fired``: its cgroup's events)."""
    output = truncate_output(raw, output_bytes)
    violations = check_command(cmd)
    if timed_out:
        violations.append("timeout")
    violations += [
        v for v in dict.fromkeys([*limit_violations(output, returncode), *fired]) if v not in violations
    ]
    return ExecResult(output, -1 if timed_out else returncode, timed_out, elapsed, violations)


def limit_violations(output: str, returncode: int) -> list[str]:
    """Which resource limit visibly fired in a command's output/exit code: used to *report*, not enforce."""
    hits = []
    if "MemoryError" in output or "Cannot allocate memory" in output or "std::bad_alloc" in output:
        hits.append("memory_limit")
    if "Resource temporarily unavailable" in output or "retry: fork" in output:
        hits.append("nproc_limit")
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or "CPU time limit" in output:
        hits.append("cpu_limit")
    if (
        returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ)
        or "File size limit" in output
        or "File too large" in output
    ):
        hits.append("fsize_limit")
    if "No space left on device" in output:
        hits.append("workspace_limit")
    return hits


def check_ro_binds(binds: dict[str, str] | None) -> dict[str, str]:
    """Host directories to mount read-only in a sandbox (host -> path inside, under ``/opt/``), checked:
    absolute existing directories, mounted under ``/opt/`` only (never over the workspace or the system)."""
    out: dict[str, str] = {}
    for host, inside in (binds or {}).items():
        h, p = Path(host), Path(inside)
        if not h.is_absolute() or not h.is_dir():
            raise ValueError(f"read-only bind {host!r}: must be an existing absolute directory")
        if not p.is_absolute() or p.parts[:2] != ("/", "opt") or len(p.parts) < 3 or ".." in p.parts:
            raise ValueError(f"read-only bind target {inside!r}: must be a path under /opt/")
        out[str(h)] = str(p)
    return out


def safe_relpath(path: str) -> str:
    """Normalise a workspace-relative path; refuse absolute paths and ``..`` (raise ``ValueError``)."""
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"sandbox path {path!r} must be relative to the workspace, without '..'")
    return p.as_posix()


def truncate_output(data: bytes, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    if len(data) > limit:
        text = text[:limit] + f"\n[... output cut at {limit} bytes]"
    return text
