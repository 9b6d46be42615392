"""Sandboxed rollouts and data generation: sandboxes (bwrap, docker), coding tasks, the agent loop, the TRL env.

Import the submodules directly (``datagen.sandbox``, ``datagen.rollout``, ``datagen.env``); names here are
resolved lazily so that importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr, lazy_exports

_EXPORTS = lazy_exports(
    {
        "sandbox": ("Sandbox", "ExecResult", "SandboxError", "SandboxLimits", "make_sandbox"),
        "bwrap_sandbox": ("BwrapSandbox",),
        "docker_sandbox": ("DockerSandbox",),
        "tasks": ("Task", "bundled_tasks", "load_task", "load_tasks", "TaskFileError", "check_name"),
        "policy": ("check_command",),
        "docker_image": ("ensure_image",),
        "rollout": (
            "run_rollout",
            "run_rollouts",
            "RolloutResult",
            "ScriptedPolicy",
            "HFPolicy",
            "oracle_policy",
        ),
        "env": ("SandboxCodingEnv", "make_test_reward"),
        "verifier": ("verify", "verify_changes", "Verdict", "CheckResult"),
    }
)
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _EXPORTS, name, cache=False)  # a patched backend module is seen at once
