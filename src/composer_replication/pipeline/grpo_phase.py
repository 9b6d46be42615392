"""The pipeline's online phase: GRPO-family RL (TRL) on the bundled sandbox coding tasks, three channels.

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
What is not covered: the sandbox's own limits (see ``datagen.bwrap_sandbox``), and tasks other than the
bundled ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json


def task_rows(names: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The selected bundled tasks and their TRL rows (``datagen.rollout.task_prompt``: the rollouts' prompt)."""
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tasks import bundled_tasks
    from composer_replication.datagen.tools import TOOL_SCHEMAS

    tasks = bundled_tasks()
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(f"grpo.tasks: unknown task(s) {unknown}; bundled tasks are {sorted(tasks)}")
    chosen = {n: tasks[n] for n in (names or sorted(tasks))}
    rows = [{"prompt": task_prompt(t), "task": n, "tools": TOOL_SCHEMAS} for n, t in chosen.items()]
    return chosen, rows


def phase_rows(task_rows_: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Task rows with the mined pairs riding along (``dpo_pair``), one per row in turn: the dataset has
    ``max(len(tasks), len(pairs))`` rows, so every task and every pair appears."""
    if not pairs:
        return [dict(r) for r in task_rows_]
    n = max(len(task_rows_), len(pairs))
    return [{**task_rows_[i % len(task_rows_)], "dpo_pair": pairs[i % len(pairs)]} for i in range(n)]


def train_grpo_on_tasks(
    cfg: Any, *, out_dir: Path, tasks: list[str], resume: bool, kill_switch: Any = None
) -> dict[str, Any]:
    """Run the online phase with the trainer's ``TrainConfig`` ``cfg`` (mode grpo); writes ``final/``."""
    from composer_replication.datagen.env import InfraStats
    from composer_replication.datagen.reward import make_shaped_reward
    from composer_replication.trainer import offline_data as od
    from composer_replication.trainer.grpo_build import build_grpo_trainer, check_grpo_config, run_grpo

    check_grpo_config(cfg, pipeline=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen, rows = task_rows(tasks)
    pairs = od.load_rows(cfg.data.pairs) if cfg.loss.preference.weight > 0 else []
    stats = InfraStats()
    reward = make_shaped_reward(chosen, stats=stats, kill_switch=kill_switch)
    trainer, callbacks = build_grpo_trainer(
        cfg, phase_rows(rows, pairs), reward, out_dir, kill_switch=kill_switch, pipeline=True
    )
    final = run_grpo(trainer, callbacks, out_dir, resume=resume, plot=False, final_dir=out_dir / "final")
    history = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rewards = [r["reward"] for r in history if r.get("reward") is not None]
    zero = [r["frac_reward_zero_std"] for r in history if r.get("frac_reward_zero_std") is not None]
    summary = {"steps": int(final.get("step", 0) or trainer.state.global_step), "tasks": len(chosen),
               "pairs": len(pairs), "rollouts_scored": stats.scored, "infra_errors": stats.infra_errors,
               "reward_hack_attempts": stats.reward_hack_attempts,
               "first_reward": rewards[0] if rewards else None, "last_reward": rewards[-1] if rewards else None,
               "mean_reward": sum(rewards) / len(rewards) if rewards else None,
               "mean_frac_reward_zero_std": sum(zero) / len(zero) if zero else None}  # fmt: skip
    for key in ("sdpo/loss", "sdpo/tokens", "pref/loss"):
        vals = [r[key] for r in history if r.get(key) is not None]
        if vals:
            summary[f"mean_{key.replace('/', '_')}"] = sum(vals) / len(vals)
    atomic_write_json(out_dir / "final_metrics.json", summary)
    return summary


def sandbox_pass_rate(
    model_dir: Path, out_dir: Path, *, tasks: list[str], max_turns: int, max_new_tokens: int, stop: Any = None
) -> dict[str, Any]:
    """Greedy agent rollouts of ``model_dir`` on the bundled tasks; pass rate over the scored ones.

    Rollouts are indexed in ``out_dir/rollouts.jsonl`` (``datagen.run_rollouts`` skips finished ones), so
    a rerun only rolls out what is missing. ``out_dir`` must be specific to the model's weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from composer_replication._io import read_jsonl
    from composer_replication.datagen.rollout import HFPolicy, run_rollouts

    chosen, _ = task_rows(tasks)
    index = out_dir / "rollouts.jsonl"
    done = {r["rollout_id"] for r in read_jsonl(index) if r["status"] == "ok"} if index.exists() else set()
    if any(f"{n}-000" not in done for n in chosen):
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
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
