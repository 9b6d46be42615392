"""The pipeline's online phase: GRPO-family RL (TRL) on sandbox coding tasks, three channels.

Prompts are the tasks' opening messages as rollouts see them (``wire``: system message with the tools and
the action format, the instruction with the workspace files). The trainer is the one ``train --mode
grpo`` uses (``trainer.grpo.build``), so every ``train`` field is honoured or rejected the same way
(``loss.label_smoothing`` and ``data.eval_fraction`` belong to the offline phase here). Its channels:

- the policy objective (``train.grpo.objective``) on the shaped sandbox reward
  (``datagen.reward.make_shaped_reward``: well-formed action, tool calls that run, fraction of the task's
  tests passing; an infrastructure failure is None and moves nothing);
- SDPO at the failed tool calls of the rollouts: the reward names the first failed call of each
  completion, its hint (``ingestion.errors.classify_error`` + ``hint_generator``) goes to the teacher,
  which is the same model given the prompt plus the hint (``train.loss.sdpo``);
- DPO on the mined pairs (``normalize/pairs.jsonl``, else none): the pairs ride along on the task rows,
  one per row in turn, so every pair is seen (``train.loss.preference``).

TRL checkpoints every ``train.checkpoint.every_steps`` steps; a rerun resumes from the newest one.

What is covered: rewards come only from tests run inside the sandbox (``datagen`` sandboxes: bwrap or
docker, no network); sandbox violations go to the kill switch, which stops training at the next step.
The tasks are ``grpo.tasks`` (a task directory, e.g. mined by ``tasks mine``, or bundled task names),
else the run's ``tasks`` section's, else every bundled task (``trainer.grpo.tasks``, shared with ``train
--mode grpo``).

What is not covered: the sandbox's own limits (see ``datagen.bwrap_sandbox``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json
from composer_replication.trainer.grpo.tasks import phase_rows

__all__ = ["phase_rows", "task_rows", "train_grpo_on_tasks"]


def task_rows(names: list[str] | str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tasks ``grpo.tasks`` names (bundled names, or a task directory: ``trainer.grpo.tasks``) and
    their TRL rows (``datagen.rollout.task_prompt``: the rollouts' prompt)."""
    from composer_replication.trainer.grpo.tasks import load_task_set
    from composer_replication.trainer.grpo.tasks import task_rows as rows

    ts = load_task_set(names)
    return ts.tasks, rows(ts)


def train_grpo_on_tasks(
    cfg: Any, *, out_dir: Path, tasks: list[str] | str | None, resume: bool, stop: Any = None
) -> dict[str, Any]:
    """Run the online phase with the trainer's ``TrainConfig`` ``cfg`` (mode grpo) on ``tasks`` (bundled
    names, empty or None for all, or a task directory); writes ``final/`` and ``final_metrics.json`` (the
    summary of ``trainer.grpo.tasks.train_on_tasks``)."""
    from composer_replication.trainer.grpo.build import check_grpo_config
    from composer_replication.trainer.grpo.tasks import load_task_set, train_on_tasks

    check_grpo_config(cfg, pipeline=True)
    summary = train_on_tasks(cfg, load_task_set(tasks), out_dir, resume=resume, stop=stop, pipeline=True)
    atomic_write_json(out_dir / "final_metrics.json", summary)
    return summary
