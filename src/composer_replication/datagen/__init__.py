"""Sandboxed rollouts and data generation: sandboxes (bwrap, docker), coding tasks, the agent loop, the TRL env.

Import the submodules directly (``datagen.sandbox``, ``datagen.rollout``, ``datagen.env``); names here are
resolved lazily so that importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr

_EXPORTS = {
    "Sandbox": "sandbox",
    "ExecResult": "sandbox",
    "SandboxError": "sandbox",
    "SandboxLimits": "sandbox",
    "make_sandbox": "sandbox",
    "BwrapSandbox": "bwrap_sandbox",
    "DockerSandbox": "docker_sandbox",
    "Task": "tasks",
    "bundled_tasks": "tasks",
    "load_task": "tasks",
    "load_tasks": "tasks",
    "TaskFileError": "tasks",
    "check_name": "tasks",
    "check_command": "policy",
    "ensure_image": "docker_image",
    "run_rollout": "rollout",
    "run_rollouts": "rollout",
    "RolloutResult": "rollout",
    "ScriptedPolicy": "rollout",
    "HFPolicy": "rollout",
    "oracle_policy": "rollout",
    "SandboxCodingEnv": "env",
    "make_test_reward": "env",
    "verify": "verifier",
    "verify_changes": "verifier",
    "Verdict": "verifier",
    "CheckResult": "verifier",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _EXPORTS, name, cache=False)  # a patched backend module is seen at once
