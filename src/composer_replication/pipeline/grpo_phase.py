"""The pipeline's online phase: GRPO-family RL (TRL) on the bundled sandbox coding tasks.

Prompts are the tasks' opening messages as rollouts see them (``wire``: system message with the tools and
the action format, the instruction with the workspace files);
the reward is ``datagen.env.make_test_reward``: each completion's tool calls are applied in a fresh
sandbox and the task's tests decide 1.0 / 0.0 (an infrastructure failure is None and moves nothing).
The policy loss is the ``train.grpo.objective`` preset through ``ComposerReplicationTrainer``; its
self-distillation and replay-DPO channels stay idle here, because task prompts carry neither a tool
error nor a preference pair (the offline phase trains those). TRL checkpoints every
``train.checkpoint.every_steps`` steps; a rerun resumes from the newest one.

What is covered: rewards come only from tests run inside the sandbox (``datagen`` sandboxes: bwrap or
docker, no network); the kill switch stops training at the next step. What is not covered: the sandbox's
own limits (see ``datagen.bwrap_sandbox``), and tasks other than the bundled ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json, write_jsonl_atomic


def task_rows(names: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The selected bundled tasks and their TRL rows (``datagen.rollout.task_prompt``: the rollouts' prompt)."""
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tasks import bundled_tasks

    tasks = bundled_tasks()
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(f"grpo.tasks: unknown task(s) {unknown}; bundled tasks are {sorted(tasks)}")
    chosen = {n: tasks[n] for n in (names or sorted(tasks))}
    rows = [{"prompt": task_prompt(t), "task": n} for n, t in chosen.items()]
    return chosen, rows


def train_grpo_on_tasks(
    cfg: Any, *, out_dir: Path, tasks: list[str], resume: bool, kill_switch: Any = None
) -> dict[str, Any]:
    """Run the online phase with the trainer's ``TrainConfig`` ``cfg`` (mode grpo); writes ``final/``."""
    import torch
    from datasets import Dataset

    from composer_replication.datagen.env import InfraStats, make_test_reward
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer
    from composer_replication.trainer.grpo_scale import grpo_config_kwargs, preflight
    from composer_replication.trainer.offline import load_model
    from composer_replication.trainer.po_objectives import make_po_config

    preflight(cfg)  # grpo.vllm: the server answers, vLLM is installed (before any model loads)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    chosen, rows = task_rows(tasks)
    model, tok = load_model(
        cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"enabled": False})}), torch.device("cpu")
    )
    tok.padding_side = "left"
    g = cfg.grpo
    args = make_po_config(
        g.objective, output_dir=str(out_dir / "checkpoints"), use_cpu=not torch.cuda.is_available(),
        report_to=cfg.logging.report_to or "none", seed=cfg.seed, learning_rate=cfg.optimizer.lr,
        max_steps=cfg.schedule.max_steps, per_device_train_batch_size=g.num_generations,
        gradient_accumulation_steps=1, num_generations=g.num_generations,
        max_completion_length=g.max_completion_length, temperature=g.temperature, logging_steps=1,
        save_strategy="steps", save_steps=max(1, cfg.checkpoint.every_steps or cfg.schedule.max_steps),
        save_total_limit=cfg.checkpoint.keep_last, disable_tqdm=not cfg.logging.progress, **(grpo_config_kwargs(cfg) | g.overrides),
    )  # fmt: skip
    stats = InfraStats()
    callbacks = []
    if kill_switch is not None:
        from composer_replication.safety.hf_callback import KillSwitchCallback

        callbacks.append(KillSwitchCallback(kill_switch))
    trainer = ComposerReplicationTrainer(
        model=model, reward_funcs=make_test_reward(chosen, stats=stats), args=args,
        train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=callbacks,
        alpha_sdpo=0.0, beta_replay=0.0, composer_kl_coef=g.composer_kl_coef,
    )  # fmt: skip
    latest = _newest_checkpoint(out_dir / "checkpoints") if resume else None
    if latest is not None and _global_step(latest) >= cfg.schedule.max_steps:
        # Already at max_steps (stopped after its last step, e.g. by Ctrl-C): resuming would train one
        # more step when the epoch has batches left (HF Trainer checks max_steps only after a step).
        trainer._load_from_checkpoint(str(latest))
        trainer.state = type(trainer.state).load_from_json(str(latest / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=str(latest) if latest is not None else None)
    for cb in callbacks:
        cb.raise_if_triggered()
    history = [
        r for r in trainer.state.log_history if "step" in r and "train_runtime" not in r
    ]  # per-step rows only
    write_jsonl_atomic(out_dir / "metrics.jsonl", history)
    from composer_replication.trainer.export import export_model

    export_model(trainer.model, tok, out_dir / "final", merge=True)
    rewards = [r for r in stats.rewards if r is not None]
    summary = {"steps": int(trainer.state.global_step), "tasks": len(chosen), "rollouts_scored": stats.scored,
               "infra_errors": stats.infra_errors, "mean_reward": sum(rewards) / len(rewards) if rewards else None}  # fmt: skip
    atomic_write_json(out_dir / "final_metrics.json", summary)
    return summary


def _newest_checkpoint(root: Path) -> Path | None:
    steps = [
        (int(p.name.split("-")[1]), p) for p in root.glob("checkpoint-*") if p.name.split("-")[1].isdigit()
    ]
    return max(steps)[1] if steps else None


def _global_step(checkpoint: Path) -> int:
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])


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
        "sandbox_pass_rate": sum(r["reward"] for r in scored) / len(scored) if scored else None,
    }
