"""The pipeline's online phase: GRPO-family RL (TRL) on sandbox coding tasks, three channels.

Prompts are the tasks' opening messages as rollouts see them (``wire``: system message with the tools and
the action format, the instruction with the workspace files). The trainer is the one ``train --mode
grpo`` uses (``trainer.grpo_build``), so every ``train`` field is honoured or rejected the same way
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
else the run's ``tasks`` section's, else every bundled task (``trainer.grpo_tasks``, shared with ``train
--mode grpo``).

What is not covered: the sandbox's own limits (see ``datagen.bwrap_sandbox``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json
from composer_replication.trainer.grpo_tasks import phase_rows

__all__ = ["phase_rows", "sandbox_pass_rate", "task_rows", "train_grpo_on_tasks"]


def task_rows(names: list[str] | str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The tasks ``grpo.tasks`` names (bundled names, or a task directory: ``trainer.grpo_tasks``) and
    their TRL rows (``datagen.rollout.task_prompt``: the rollouts' prompt)."""
    from composer_replication.trainer.grpo_tasks import load_task_set
    from composer_replication.trainer.grpo_tasks import task_rows as rows

    ts = load_task_set(names)
    return ts.tasks, rows(ts)


def train_grpo_on_tasks(
    cfg: Any, *, out_dir: Path, tasks: list[str] | str | None, resume: bool, stop: Any = None
) -> dict[str, Any]:
    """Run the online phase with the trainer's ``TrainConfig`` ``cfg`` (mode grpo) on ``tasks`` (bundled
    names, empty or None for all, or a task directory); writes ``final/`` and ``final_metrics.json`` (the
    summary of ``trainer.grpo_tasks.train_on_tasks``)."""
    from composer_replication.trainer.grpo_build import check_grpo_config
    from composer_replication.trainer.grpo_tasks import load_task_set, train_on_tasks

    check_grpo_config(cfg, pipeline=True)
    summary = train_on_tasks(cfg, load_task_set(tasks), out_dir, resume=resume, stop=stop, pipeline=True)
    atomic_write_json(out_dir / "final_metrics.json", summary)
    return summary


def sandbox_pass_rate(
    model_dir: Path, out_dir: Path, *, tasks: list[str], max_turns: int, max_new_tokens: int, stop: Any = None
) -> dict[str, Any]:
    """Greedy agent rollouts of ``model_dir`` on the bundled tasks; pass rate over the scored ones.

    Rollouts are indexed in ``out_dir/rollouts.jsonl`` (``datagen.run_rollouts`` skips finished ones), so
    a rerun only rolls out what is missing. ``out_dir`` must be specific to the model's weights.
    """
    from composer_replication._io import read_jsonl
    from composer_replication.datagen.rollout import HFPolicy, run_rollouts
    from composer_replication.models import load_model_and_tokenizer

    chosen, _ = task_rows(tasks)
    index = out_dir / "rollouts.jsonl"
    done = {r["rollout_id"] for r in read_jsonl(index) if r["status"] == "ok"} if index.exists() else set()
    if any(f"{n}-000" not in done for n in chosen):
        model, tok = load_model_and_tokenizer(model_dir)  # float32, a pad token; an adapter merged
        model.eval()
        policy = HFPolicy(model, tok, max_new_tokens=max_new_tokens, temperature=0.0)
        run_rollouts(
            list(chosen.values()), lambda t: policy, out_dir, max_turns=max_turns, stop=stop, progress=False
        )
    latest = {r["rollout_id"]: r for r in read_jsonl(index)}
    scored = [r for r in latest.values() if r["status"] == "ok" and r["task"] in chosen]
    return {
        "sandbox_tasks": len(chosen),
        "sandbox_scored": len(scored),
        "sandbox_infra_errors": sum(r["status"] != "ok" for r in latest.values()),
        "sandbox_reward_hack_attempts": sum(bool(r.get("reward_hack")) for r in scored),
        "sandbox_pass_rate": sum(r["reward"] for r in scored) / len(scored) if scored else None,
    }
