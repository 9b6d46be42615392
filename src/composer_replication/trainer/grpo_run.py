"""``train_grpo(config, out_dir=...)``: the ``grpo`` mode of the ``train`` command, over TRL.

Prompts come from the ingested data: each preference pair's ``state_messages`` (the row also carries
the pair, so the DPO channel trains on it) and each tool-error site of a trace (the row carries
``error_kind``/``error_meta``, so the SDPO teacher is the same model given the hint). Rewards
(``grpo.reward.type``):

- ``teacher_match``: 1.0 when the completion's canonical action equals the row's reference action (the
  teachers' consensus for pair rows, the student's own recovery for error-site rows), else half the
  ``difflib`` similarity of the two action texts;
- ``tool_format``: 1.0 when the completion parses as at least one tool call (``wire``), else 0.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication.config import TrainConfig
from composer_replication.trainer import offline_data as od
from composer_replication.trainer import pair_tokens


def build_rows(traces: list[dict], pairs: list[dict]) -> list[dict]:
    """Dataset rows for TRL: ``prompt``, ``reference`` and optionally ``dpo_pair`` / ``error_kind``.

    Trace rows are rendered with ``wire.trace_messages`` (the system message with the trace's tools, the
    history up to the recovery turn), token for token what evaluation shows the model at the same state.
    Each recovery (``state_id`` of the assistant turn) gives one row, from its ``error_site`` example when
    the traces have kinds (an episode repeats the same site).
    """
    rows = []
    for pair in pairs:
        _, messages, chosen, _ = pair_tokens.pair_fields(pair)
        rows.append({"prompt": messages, "reference": chosen, "dpo_pair": pair})
    kinds = {t.get("kind") for t in traces}
    if "error_site" in kinds:
        traces = sorted(traces, key=lambda t: t.get("kind") != "error_site")  # error_site examples first
    seen: set[str] = set()
    for trace in traces:
        turns = trace.get("turns") or []
        for i, turn in enumerate(turns):
            if turn.get("role") != "tool" or not turn.get("tool_error"):
                continue
            j = next((k for k in range(i + 1, len(turns)) if turns[k].get("role") == "assistant"), None)
            if j is None or not turns[j].get("content"):
                continue
            key = turns[j].get("state_id") or f"{trace.get('trace_id')}#{trace.get('example_id')}#{j}"
            if key in seen:
                continue
            seen.add(key)
            meta = dict(turn.get("error_meta") or {})
            rows.append(
                {
                    "prompt": wire.trace_messages(trace, j)[0],
                    "reference": str(turns[j]["content"]),
                    "state_id": turns[j].get("state_id"),
                    "error_kind": meta.get("error_kind") or "runtime_error",
                    "error_meta": meta,
                }
            )
    return rows


def fit_prompt(tok: Any, messages: list[dict], max_len: int) -> list[dict]:
    """``wire.fit_messages``: drop the oldest messages (the system message stays) until the prompt fits."""
    return wire.fit_messages(tok, messages, max_len)


def _completion_text(c: Any) -> str:
    return c[-1]["content"] if isinstance(c, list) else str(c)


def teacher_match_reward(completions: list, reference: list[str], **_: Any) -> list[float]:
    canonical_action = wire.canonical_action
    out = []
    for c, ref in zip(completions, reference):
        text = _completion_text(c)
        if canonical_action(text) is not None and canonical_action(text) == canonical_action(ref):
            out.append(1.0)
        else:
            out.append(0.5 * difflib.SequenceMatcher(None, text, ref).ratio())
    return out


def tool_format_reward(completions: list, **_: Any) -> list[float]:
    return [1.0 if wire.parse_action(_completion_text(c)).tool_calls else 0.0 for c in completions]


def train_grpo(
    cfg: TrainConfig,
    *,
    out_dir: str | Path,
    resume: bool = False,
    kill_switch: Any | None = None,
    merge: bool = False,
) -> dict[str, float]:
    """Run ``ComposerReplicationTrainer`` per ``cfg``, export ``out_dir/final`` (``trainer.export``;
    ``merge``: LoRA merged into the weights) and return TRL's last logged metrics."""
    import torch
    from datasets import Dataset

    from composer_replication._io import JsonlAppender, atomic_write_json
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer
    from composer_replication.trainer.grpo_scale import grpo_config_kwargs, preflight
    from composer_replication.trainer.offline import load_model
    from composer_replication.trainer.po_objectives import make_po_config

    preflight(cfg)  # grpo.vllm: the server answers, vLLM is installed (before any model loads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # LoRA goes through TRL's peft_config below, so the base model is loaded without it.
    model, tok = load_model(
        cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"enabled": False})}), device
    )
    tok.padding_side = "left"
    rows = build_rows(od.load_rows(cfg.data.traces), od.load_rows(cfg.data.pairs))
    for row in rows:  # TRL 1.16 has no prompt-length cap: the agent histories would run to 20k tokens
        row["prompt"] = fit_prompt(tok, row["prompt"], cfg.data.max_seq_len)
    if not rows:
        raise ValueError(
            "grpo mode found no prompts: data.pairs has no pairs and data.traces no tool-error sites"
        )
    g = cfg.grpo
    args = make_po_config(
        g.objective,
        output_dir=str(out / "checkpoints"),
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.model.dtype == "bfloat16",
        report_to=cfg.logging.report_to or "none",
        seed=cfg.seed,
        learning_rate=cfg.optimizer.lr,
        weight_decay=cfg.optimizer.weight_decay,
        max_grad_norm=cfg.optimizer.grad_clip or 0.0,
        lr_scheduler_type=cfg.schedule.type,
        warmup_steps=cfg.schedule.warmup_steps,
        max_steps=cfg.schedule.max_steps,
        per_device_train_batch_size=max(cfg.schedule.batch_size, g.num_generations),
        gradient_accumulation_steps=cfg.schedule.grad_accum,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        logging_steps=cfg.logging.log_every,
        save_strategy="steps" if cfg.checkpoint.every_steps else "no",
        save_steps=cfg.checkpoint.every_steps or 500,
        save_total_limit=cfg.checkpoint.keep_last,
        disable_tqdm=not cfg.logging.progress,
        **(grpo_config_kwargs(cfg) | g.overrides),  # processes, vLLM (trainer.grpo_scale)
    )
    reward = teacher_match_reward if g.reward.type == "teacher_match" else tool_format_reward
    peft_config = None
    if cfg.lora.enabled:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
            target_modules=cfg.lora.target_modules, task_type="CAUSAL_LM",
        )  # fmt: skip
    callbacks = []
    if kill_switch is not None:
        from composer_replication.safety.hf_callback import KillSwitchCallback

        callbacks.append(KillSwitchCallback(kill_switch))
    s, p = cfg.loss.sdpo, cfg.loss.preference
    trainer = ComposerReplicationTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        peft_config=peft_config,
        callbacks=callbacks,
        alpha_sdpo=s.weight,
        beta_replay=p.weight,
        sdpo_jsd_beta=s.jsd_beta,
        sdpo_temperature=s.temperature,
        sdpo_token_clip=s.token_clip,
        replay_dpo_beta=p.dpo_beta,
        simpo_beta=p.simpo_beta,
        simpo_gamma=p.simpo_gamma,
        dpo_variant=p.variant,
        composer_kl_coef=g.composer_kl_coef,
        max_dpo_seq_len=cfg.data.max_dpo_seq_len,
    )
    resume_arg = bool(resume and list((out / "checkpoints").glob("checkpoint-*")))
    trainer.train(resume_from_checkpoint=resume_arg or None)
    for cb in callbacks:
        cb.raise_if_triggered()
    final = {k: float(v) for k, v in trainer.state.log_history[-1].items() if isinstance(v, int | float)}
    if not trainer.accelerator.is_main_process:  # accelerate launch: rank 0 writes the outputs
        return final
    metrics_log = JsonlAppender(out / "metrics.jsonl")
    for row in trainer.state.log_history:
        if "step" in row and "loss" in row:
            metrics_log.write({"step": row["step"], "loss/total": row["loss"], **row})
    metrics_log.close()
    atomic_write_json(out / "final_metrics.json", final)
    from composer_replication.trainer.export import base_dir, export_model

    export_model(trainer.model, tok, out / "final", merge=merge, base_dir=base_dir(cfg))
    if cfg.logging.plot:
        from composer_replication.trainer.plots import plot_losses

        plot_losses(out / "metrics.jsonl", out / "losses.png", keys=("loss/total", "sdpo/loss", "pref/loss"))
    return final
