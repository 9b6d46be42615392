"""One GRPO builder: ``train --mode grpo`` and the pipeline's online phase assemble TRL here.

``build_grpo_trainer(cfg, rows, reward_funcs, out_dir)`` turns a ``TrainConfig`` into a
``ComposerReplicationTrainer`` (TRL's ``GRPOTrainer`` with the SDPO and DPO channels on top), and
``run_grpo`` trains it (resuming from the newest checkpoint) and writes ``metrics.jsonl`` and
``final_metrics.json``. The two callers differ only in their rows and rewards: trace error sites and
preference pairs scored against a reference action (``trainer.grpo.run``), or sandbox tasks with the
mined pairs riding along, scored by running the tests (``pipeline.grpo_phase``).

Every config field is honoured or rejected: ``config.grpo_config_problems`` names the rejected ones and
docs/training.md ("Every config field is honoured or rejected") maps the others to TRL's arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._extras import require
from composer_replication.config import ConfigError, TrainConfig, grpo_config_problems

_SCHEDULES = {"constant": "constant", "linear": "linear", "cosine": "cosine"}


def check_grpo_config(cfg: TrainConfig, *, pipeline: bool = False) -> None:
    """Raise ``ConfigError`` naming every field grpo mode cannot honour (``config.grpo_config_problems``;
    ``grpo.overrides`` keys are also checked against ``trl.GRPOConfig``)."""
    import dataclasses

    from trl import GRPOConfig

    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    problems = grpo_config_problems(cfg, pipeline=pipeline, known_args=known)
    if problems:
        raise ConfigError("grpo mode cannot honour:\n  " + "\n  ".join(problems))


def grpo_args(cfg: TrainConfig, out_dir: Path, *, cuda: bool) -> Any:
    """The ``trl.GRPOConfig`` for ``cfg`` (the ``grpo.objective`` preset plus every mapped field)."""
    import torch

    from composer_replication.trainer.grpo.objectives import make_po_config
    from composer_replication.trainer.grpo.scale import grpo_config_kwargs

    g, o, s = cfg.grpo, cfg.optimizer, cfg.schedule
    bf16 = cfg.model.dtype == "bfloat16" or (
        cfg.model.dtype == "auto" and cuda and torch.cuda.is_bf16_supported()
    )
    schedule = "constant_with_warmup" if s.type == "constant" and s.warmup_steps else _SCHEDULES[s.type]
    every = cfg.checkpoint.every_steps or s.max_steps  # 0: a checkpoint at the end only
    return make_po_config(
        g.objective,
        output_dir=str(out_dir / "checkpoints"),
        use_cpu=not cuda,
        bf16=bf16,
        report_to=cfg.logging.report_to or "none",
        seed=cfg.seed,
        learning_rate=o.lr,
        optim="sgd" if o.type == "sgd" else "adamw_torch",
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip or 0.0,
        lr_scheduler_type=schedule,
        warmup_steps=s.warmup_steps,
        max_steps=s.max_steps,
        per_device_train_batch_size=s.batch_size * g.num_generations,
        gradient_accumulation_steps=s.grad_accum,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        logging_steps=cfg.logging.log_every,
        save_strategy="steps",
        save_steps=every,
        save_total_limit=cfg.checkpoint.keep_last,
        disable_tqdm=not cfg.logging.progress,
        **(grpo_config_kwargs(cfg) | g.overrides),  # processes, vLLM (trainer.grpo.scale)
    )


_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "is_error")


def _arrow_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message with one shape for Arrow: every key (None where absent), calls with JSON-text arguments."""
    out = {k: m.get(k) for k in _MESSAGE_KEYS}
    out["content"] = str(m.get("content") or "")
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments")
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(
            {
                "id": str(c.get("id") or ""),
                "type": "function",
                "function": {"name": str(fn.get("name")), "arguments": args},
            }
        )
    out["tool_calls"] = calls or None
    return out


def dataset_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows Arrow can hold whatever their source: every row gets every key (None where absent), prompt
    messages one shape (``_MESSAGE_KEYS``), and dict and schema-list values (``error_meta``, ``dpo_pair``,
    ``tools``) travel as JSON text (Claude Code and Codex tool inputs differ in type: a column of dicts
    would not unify). ``ComposerReplicationTrainer`` renders each prompt with its row's ``tools``."""
    keys = sorted({k for r in rows for k in r})
    out = []
    for r in rows:
        row = {}
        for k in keys:
            v = r.get(k)
            if k == "prompt" and isinstance(v, list):
                v = [_arrow_message(m) for m in v]
            elif isinstance(v, dict) or (k == "tools" and v is not None):
                v = json.dumps(v, ensure_ascii=False, default=str)
            row[k] = v
        out.append(row)
    return out


def fit_prompts(rows: list[dict[str, Any]], tok: Any, max_len: int) -> None:
    """Cut each history prompt to ``max_len`` tokens in place (``wire.fit_messages``: TRL 1.16 has no
    prompt-length cap, and agent histories would run to 20k tokens). A task's prompt (a row with a
    ``task``) stays whole: cutting it keeps the end of the workspace files and drops the instruction, and
    ``wire.task_text`` already bounds it (file contents only up to 3,000 characters)."""
    for row in rows:
        if isinstance(row.get("prompt"), list) and not row.get("task"):
            row["prompt"] = wire.fit_messages(tok, row["prompt"], max_len, row.get("tools"))


def build_grpo_trainer(
    cfg: TrainConfig,
    rows: list[dict[str, Any]],
    reward_funcs: Any,
    out_dir: Path,
    *,
    stop: Any = None,
    pipeline: bool = False,
) -> tuple[Any, list[Any]]:
    """``(ComposerReplicationTrainer, callbacks)`` for ``cfg`` over ``rows`` (``prompt`` + extra columns)."""
    import torch
    from datasets import Dataset

    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer
    from composer_replication.trainer.grpo.scale import preflight
    from composer_replication.trainer.prepare import load_model, make_taid

    check_grpo_config(cfg, pipeline=pipeline)
    preflight(cfg)  # grpo.vllm: the server answers, vLLM is installed (before any model loads)
    if not rows:
        raise ValueError("grpo mode has no prompts: no pairs, no tool-error sites and no tasks")
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(cfg.seed)
    cuda = torch.cuda.is_available()
    # LoRA goes through TRL's peft_config, so the base model is loaded without it.
    model, tok = load_model(
        cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"enabled": False})}),
        torch.device("cuda" if cuda else "cpu"),
    )
    tok.padding_side = "left"
    fit_prompts(rows, tok, cfg.data.max_seq_len)
    peft_config = None
    if cfg.lora.enabled:
        require("trl", "peft", purpose="LoRA")
        from peft import LoraConfig

        lo = cfg.lora
        peft_config = LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                                 target_modules=lo.target_modules, task_type="CAUSAL_LM")  # fmt: skip
    callbacks = []
    if stop is not None:
        from composer_replication.safety.hf_callback import KillSwitchCallback

        callbacks.append(KillSwitchCallback(stop))
    # the loss section's channel arguments (label smoothing is rejected in grpo mode: no LM-CE channel here)
    channels = {k: v for k, v in cfg.loss.compose_loss_kwargs().items() if k != "lm_ce_label_smoothing"}
    taid = make_taid(cfg)  # t follows the GRPO steps as it follows the offline ones
    trainer = ComposerReplicationTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=grpo_args(cfg, out_dir, cuda=cuda),
        train_dataset=Dataset.from_list(dataset_rows(rows)),
        processing_class=tok,
        peft_config=peft_config,
        callbacks=callbacks,
        sdpo_taid=taid,
        **channels,
        composer_kl_coef=cfg.grpo.composer_kl_coef,
        max_dpo_seq_len=cfg.data.max_dpo_seq_len,
    )
    return trainer, callbacks


def _newest_checkpoint(out_dir: Path) -> Path | None:
    ckpts = [p for p in (out_dir / "checkpoints").glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(ckpts, key=lambda p: int(p.name.split("-")[-1]), default=None)


def run_grpo(
    trainer: Any,
    callbacks: list[Any],
    out_dir: Path,
    *,
    resume: bool,
    plot: bool,
    final_dir: Path | None = None,
    merge: bool = True,
    base_dir: Path | None = None,
) -> dict[str, float]:
    """Train (from the newest checkpoint when ``resume``), then write ``metrics.jsonl`` (one row per
    logged step: ``loss/total`` and TRL's own keys: reward, reward_std, frac_reward_zero_std, the
    channels), ``final_metrics.json`` and, with ``final_dir``, the trained model
    (``trainer.export.export_model``: LoRA merged, or its adapter over ``base_dir`` with ``merge=False``).
    Returns the last logged metrics. When the kill switch stopped training, the log is written and its
    `KillSwitchTriggered` is raised (no final model). Under ``accelerate launch`` rank 0 writes the outputs.

    A run whose newest checkpoint already reached ``max_steps`` is not trained again (HF's Trainer would
    take one more step when the epoch has rows left): its weights and log come from that checkpoint.
    """
    from composer_replication._io import atomic_write_json, write_jsonl_atomic

    latest = _newest_checkpoint(out_dir) if resume else None
    done = None
    if latest is not None:
        state = json.loads((latest / "trainer_state.json").read_text())
        if int(state.get("global_step", 0)) >= trainer.args.max_steps:
            done = state
    stopped: Exception | None = None
    if done is None:
        trainer.train(resume_from_checkpoint=str(latest) if latest is not None else None)
        for cb in callbacks:
            try:
                cb.raise_if_triggered()
            except Exception as exc:  # the kill switch: the log is written first, then it propagates
                stopped = exc
        history = trainer.state.log_history
    else:
        assert latest is not None  # done comes from it
        trainer._load_from_checkpoint(str(latest))
        trainer.state = type(trainer.state).load_from_json(str(latest / "trainer_state.json"))
        history = trainer.state.log_history
    last = history[-1] if history else {}
    final = {k: float(v) for k, v in last.items() if isinstance(v, int | float)}
    if not trainer.accelerator.is_main_process:
        if stopped is not None:
            raise stopped
        return final
    rows = [{"step": r["step"], "loss/total": r["loss"], **r} for r in history if "step" in r and "loss" in r]
    write_jsonl_atomic(out_dir / "metrics.jsonl", rows)
    atomic_write_json(out_dir / "final_metrics.json", final)
    if plot and rows:
        from composer_replication.trainer.plots import plot_losses

        plot_losses(
            out_dir / "metrics.jsonl", out_dir / "losses.png", keys=("loss/total", "sdpo/loss", "pref/loss")
        )
    if stopped is not None:
        raise stopped
    if final_dir is not None:
        from composer_replication.trainer.export import export_model

        export_model(trainer.model, trainer.processing_class, final_dir, merge=merge, base_dir=base_dir)
    return final
