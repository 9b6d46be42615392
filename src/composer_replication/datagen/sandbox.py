"""The `Sandbox` protocol, the exec result record, the command policy, and the one dispatch on `type`.

What is covered: a single interface that every backend (`bwrap_sandbox`, `docker_sandbox`) implements,
so rollouts, rewards and data generation never know which isolation runs underneath; a small command
policy that reports obvious escape attempts (``mount``, ``nsenter``, reads of ``/proc/1``, ...) as
violations *in addition to* the isolation that actually stops them.

What is not covered: the policy is a tripwire, not a boundary. A determined program can obfuscate a
command; isolation comes from the backend (namespaces, read-only mounts, rlimits), never from the
policy. See docs/sandbox.md for the threat model.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

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
    """Resource limits applied to every command (per process unless stated).

    ``cpu_s`` is CPU seconds (RLIMIT_CPU); ``memory_mb`` the address space (RLIMIT_AS for bwrap,
    ``--memory`` for docker); ``nproc`` the process count (RLIMIT_NPROC for the sandbox uid / docker
    ``--pids-limit``); ``fsize_mb`` the largest file a command may write; ``output_bytes`` how much
    stdout+stderr is kept (the rest is cut, with a marker).
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


# Tripwires: commands that no coding task needs and that escape attempts use. Matching one is
# *reported* (the command still runs, inside the isolation) so the kill switch sees attempts.
_POLICY: list[tuple[str, re.Pattern[str]]] = [
    ("namespace_escape", re.compile(r"\b(nsenter|unshare|chroot|pivot_root|setns)\b")),
    ("mount", re.compile(r"(^|[\s;&|(])(u?mount)\s")),
    ("privilege", re.compile(r"(^|[\s;&|(])(sudo|su|doas|setcap|capsh)\s")),
    ("host_proc", re.compile(r"/proc/1/(root|environ|mem)|/proc/sys/kernel")),
    ("docker_socket", re.compile(r"/var/run/docker\.sock|/run/containerd")),
    ("secrets", re.compile(r"/etc/shadow|\.ssh/id_|\.aws/credentials|\.netrc")),
    ("fork_bomb", re.compile(r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:")),
    ("network", re.compile(r"\b(curl|wget|nc|ncat|socat|ssh|scp)\s")),
]


def check_command(cmd: str) -> list[str]:
    """Names of the policy rules ``cmd`` trips (empty when none). Pure function; see module docstring."""
    return [name for name, pat in _POLICY if pat.search(cmd)]


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


def default_sandbox_type() -> SandboxType:
    """``docker`` when a daemon answers, else ``bwrap`` (the CI default: it needs no daemon)."""
    from composer_replication.datagen.docker_sandbox import docker_available

    if docker_available():
        return "docker"
    if shutil.which("bwrap"):
        return "bwrap"
    raise SandboxError(
        "no sandbox backend: install bubblewrap (apt-get install bubblewrap) or start a Docker daemon"
    )


def make_sandbox(type: SandboxType | None = None, **kwargs: Any) -> Sandbox:
    """Build a sandbox by ``type`` (``"bwrap"``, ``"docker"``, ``"podman"``; None = `default_sandbox_type`).

    Keyword arguments go to the backend (``limits=SandboxLimits(...)``, ``image=`` for docker, ...).
    """
    type = type or default_sandbox_type()
    if type == "bwrap":
        from composer_replication.datagen.bwrap_sandbox import BwrapSandbox

        return BwrapSandbox(**kwargs)
    if type in ("docker", "podman"):
        from composer_replication.datagen.docker_sandbox import DockerSandbox

        return DockerSandbox(executable=type, **kwargs)
    raise ValueError(f"unknown sandbox type {type!r}; expected one of 'bwrap', 'docker', 'podman'")
