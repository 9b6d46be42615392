"""Tasks mined from your own sessions and their repositories, and scoring policies on them (docs/tasks.md).

``mine_tasks(paths, out_dir, ...)`` turns each user request that changed files and ran tests into a task
folder in the Harbor / Terminal-Bench layout, validated in the sandbox (FAIL_TO_PASS at the start, every
check passing with the reference); ``evaluate(tasks_dir, policy, out_dir)`` scores a policy on a task set
with the project's verifier (``--policy reference`` must pass every task, ``noop`` none).
"""

from __future__ import annotations

from composer_replication.tasks.build import Options
from composer_replication.tasks.mine import mine_tasks

__all__ = ["Options", "mine_tasks"]
