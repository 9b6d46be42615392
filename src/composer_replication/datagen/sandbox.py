"""The `Sandbox` protocol, the exec result record, the command policy, and the one dispatch on `type`.

What is covered: a single interface that every backend (`bwrap_sandbox`, `docker_sandbox`) implements,
so rollouts, rewards and data generation never know which isolation runs underneath; the command
tripwire (`policy.check_command`, re-exported here) that reports obvious escape attempts (``mount``,
``nsenter``, reads of ``/proc/1``, ...) as violations *in addition to* the isolation that stops them.

What is not covered: the policy is a tripwire, not a boundary. A determined program can obfuscate a
command; isolation comes from the backend (namespaces, read-only mounts, cgroups, seccomp, rlimits),
never from the policy. See docs/sandbox.md for the threat model.

The protocol and its records live in `datagen.sandbox_base` (what the backends import); this module adds
the dispatch (`make_sandbox`, `default_sandbox_type`), which imports the backends.
"""

from __future__ import annotations

import shutil
from typing import Any

from composer_replication.datagen.sandbox_base import (
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxType,
    check_command,
    limit_violations,
    safe_relpath,
    truncate_output,
)

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxType",
    "check_command",
    "default_sandbox_type",
    "limit_violations",
    "make_sandbox",
    "safe_relpath",
    "truncate_output",
]


def default_sandbox_type() -> SandboxType:
    """``docker`` when a daemon answers and the sandbox image is built, else ``bwrap`` (needs no daemon)."""
    from composer_replication.datagen.docker_image import SANDBOX_IMAGE
    from composer_replication.datagen.docker_sandbox import docker_available, image_present

    if docker_available() and image_present(SANDBOX_IMAGE):
        return "docker"
    if shutil.which("bwrap"):
        return "bwrap"
    raise SandboxError(
        "no sandbox backend: install bubblewrap (apt-get install bubblewrap) or start a Docker daemon and "
        "build the image (python3 -m composer_replication.datagen.docker_image)"
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
