"""GRPO on sandbox coding tasks: ``grpo.tasks`` for ``train --mode grpo`` and the pipeline's online phase.

`load_task_set(spec)` reads the tasks: a task directory (mined by ``tasks mine``, or folders in the
``task.json`` layout, loaded by ``tasks.evaluate.load_task_dir``: a folder that does not load is named and
left out) or bundled task names (None or an empty list: all of them). A mined task whose checks need a
prepared environment gets its own sandbox factory (``tasks.evaluate.task_sandbox``: the cached
site-packages mounted read-only), prepared here if missing; a task whose environment cannot be prepared is
named and left out.

`train_on_tasks` runs TRL's GRPO (``trainer.grpo.build``) on one row per task: the task's opening messages
as a rollout sees them (``datagen.rollout.task_prompt``, the sandbox's four tools), with the preference
pairs riding along (`phase_rows`). Reward: ``datagen.reward.make_shaped_reward``, each completion's tool
calls applied in a fresh sandbox with the task's files, then

- ``tests`` (weight 0.7): the verifier's ``tests_score``: the mean over the task's checks of the share of
  each check's tests passing (a check that passes whole counts 1; 0 when a protected path was touched);
- ``format`` (0.1) and ``runs`` (0.2): a well-formed action, tool calls that ran.

An infrastructure failure is None: TRL leaves it out of the group's mean and std. SDPO applies at each
completion's first failed tool call (the reward's hints), DPO on the pairs. The summary reports the mean
reward, ``frac_reward_zero_std`` (the share of groups whose completions all scored the same: no policy
gradient), infrastructure failures and reward-hack attempts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.datagen.sandbox import Sandbox, SandboxError, make_sandbox
from composer_replication.datagen.tasks import Task

__all__ = ["TaskSet", "load_task_set", "phase_rows", "task_rows", "train_on_tasks", "train_tasks_mode"]


@dataclass
class TaskSet:
    """The tasks to train on; ``sandboxes``: per task, the sandbox factory its rewards run in;
    ``left_out``: folders or tasks that could not be used, each with its reason."""

    tasks: dict[str, Task]
    sandboxes: dict[str, Callable[[], Sandbox]] = field(default_factory=dict)
    where: str = "bundled"
    left_out: list[dict[str, str]] = field(default_factory=list)


def load_task_set(
    spec: str | list[str] | None,
    *,
    sandbox: Any = None,
    env_cache: Any = None,
    log: Callable[[str], None] = print,
) -> TaskSet:
    """The tasks ``spec`` names (module docstring). Raises ``ValueError`` naming ``grpo.tasks`` for
    unknown bundled names or a directory without a usable task."""
    if spec is None or isinstance(spec, list):
        from composer_replication.datagen.tasks import bundled_tasks

        bundled = bundled_tasks()
        unknown = sorted(set(spec or []) - set(bundled))
        if unknown:
            raise ValueError(f"grpo.tasks: unknown task(s) {unknown}; bundled tasks are {sorted(bundled)}")
        return TaskSet({n: bundled[n] for n in (spec or sorted(bundled))})
    from composer_replication.tasks.evaluate import load_task_dir, task_sandbox

    tasks, extra = load_task_dir(spec, log)
    ts = TaskSet({}, where=str(spec), left_out=list(extra["malformed"]))
    for task in tasks:
        try:
            made = task_sandbox(extra["environment"].get(task.name, {}), sandbox, env_cache)
        except SandboxError as e:
            log(f"task {task.name}: left out: its environment could not be prepared: {e}")
            ts.left_out.append({"task": task.name, "reason": f"environment: {e}"})
            continue
        ts.tasks[task.name] = task
        ts.sandboxes[task.name] = made if callable(made) else functools.partial(make_sandbox, made)
    if not ts.tasks:
        raise ValueError(f"grpo.tasks {spec}: no usable task folder ({len(ts.left_out)} left out)")
    return ts


def task_rows(ts: TaskSet) -> list[dict[str, Any]]:
    """One TRL row per task: ``prompt`` (``datagen.rollout.task_prompt``), ``task`` (its name) and
    ``tools`` (the sandbox's four tools, which the shaped reward runs)."""
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tools import TOOL_SCHEMAS

    return [{"prompt": task_prompt(t), "task": n, "tools": TOOL_SCHEMAS} for n, t in ts.tasks.items()]


def phase_rows(task_rows_: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Task rows with the mined pairs riding along (``dpo_pair``), one per row in turn: the dataset has
    ``max(len(tasks), len(pairs))`` rows, so every task and every pair appears."""
    if not pairs:
        return [dict(r) for r in task_rows_]
    n = max(len(task_rows_), len(pairs))
    return [{**task_rows_[i % len(task_rows_)], "dpo_pair": pairs[i % len(pairs)]} for i in range(n)]


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def train_on_tasks(
    cfg: Any,
    ts: TaskSet,
    out_dir: Path,
    *,
    resume: bool,
    stop: Any = None,
    pipeline: bool = False,
    plot: bool = False,
    merge: bool = True,
    base_dir: Path | None = None,
) -> dict[str, Any]:
    """GRPO with the trainer's ``TrainConfig`` ``cfg`` on ``ts`` (module docstring); writes
    ``out_dir/final`` (``merge``: LoRA merged, else the adapter over ``base_dir``) and returns the summary:
    steps, tasks, pairs, scored rollouts, infrastructure failures, reward-hack attempts, first / last /
    mean reward, mean ``frac_reward_zero_std`` and the channels' mean losses."""
    from composer_replication.datagen.env import InfraStats
    from composer_replication.datagen.reward import make_shaped_reward
    from composer_replication.trainer import data as od
    from composer_replication.trainer.grpo.build import build_grpo_trainer, run_grpo

    out_dir.mkdir(parents=True, exist_ok=True)
    pairs = od.load_rows(cfg.data.pairs) if cfg.loss.preference.weight > 0 else []
    stats = InfraStats()
    reward = make_shaped_reward(ts.tasks, stats=stats, stop=stop, task_sandboxes=ts.sandboxes)
    rows = phase_rows(task_rows(ts), pairs)
    trainer, callbacks = build_grpo_trainer(cfg, rows, reward, out_dir, stop=stop, pipeline=pipeline)
    final = run_grpo(trainer, callbacks, out_dir, resume=resume, plot=plot, final_dir=out_dir / "final",
                     merge=merge, base_dir=base_dir)  # fmt: skip
    history = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rewards = [r["reward"] for r in history if r.get("reward") is not None]
    zero = [r["frac_reward_zero_std"] for r in history if r.get("frac_reward_zero_std") is not None]
    summary = {"steps": int(final.get("step", 0) or trainer.state.global_step), "tasks": len(ts.tasks),
               "task_set": ts.where, "tasks_left_out": len(ts.left_out), "pairs": len(pairs),
               "rollouts_scored": stats.scored, "infra_errors": stats.infra_errors,
               "reward_hack_attempts": stats.reward_hack_attempts,
               "first_reward": rewards[0] if rewards else None, "last_reward": rewards[-1] if rewards else None,
               "mean_reward": _mean(rewards), "mean_frac_reward_zero_std": _mean(zero)}  # fmt: skip
    for key in ("sdpo/loss", "sdpo/tokens", "pref/loss"):
        vals = [r[key] for r in history if r.get(key) is not None]
        if vals:
            summary[f"mean_{key.replace('/', '_')}"] = sum(vals) / len(vals)
    return summary


def train_tasks_mode(cfg: Any, out: Path, *, resume: bool, stop: Any, merge: bool) -> dict[str, Any]:
    """``train --mode grpo`` with ``grpo.tasks``: `train_on_tasks` into ``out`` (the adapter over the base
    model unless ``merge``); ``final_metrics.json`` holds TRL's last logged metrics and the summary."""
    from composer_replication._io import atomic_write_json
    from composer_replication.trainer.export import base_dir

    ts = load_task_set(cfg.grpo.tasks)
    summary = train_on_tasks(cfg, ts, out, resume=resume, stop=stop, plot=cfg.logging.plot,
                             merge=merge, base_dir=base_dir(cfg))  # fmt: skip
    metrics = json.loads((out / "final_metrics.json").read_text()) | summary
    atomic_write_json(out / "final_metrics.json", metrics)
    return metrics
