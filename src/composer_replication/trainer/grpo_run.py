"""``train_grpo(config, out_dir=...)``: the ``grpo`` mode of the ``train`` command, over TRL.

Prompts come from the ingested data: each preference pair's ``state_messages`` (the row also carries
the pair, so the DPO channel trains on it) and each tool-error site of a trace (the row carries
``error_kind``/``error_meta``, so the SDPO teacher is the same model given the hint). Rewards
(``grpo.reward.type``):

- ``teacher_match``: 1.0 when the completion's canonical action equals the row's reference action (the
  teachers' consensus for pair rows, the student's own recovery for error-site rows), else half the
  ``difflib`` similarity of the two action texts;
- ``tool_format``: 1.0 when the completion parses as at least one ``[TOOL_USE]`` call, else 0.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from composer_replication.config import TrainConfig
from composer_replication.trainer import offline_data as od
from composer_replication.trainer import pair_tokens


def _turns_to_messages(turns: list[dict]) -> list[dict]:
    from composer_replication.teacher_replay.actions import format_tool_use

    msgs = []
    for t in turns:
        role = t.get("role")
        if role == "assistant":
            parts = [t.get("content") or ""]
            if t.get("tool_call"):
                parts.append(
                    format_tool_use(t["tool_call"].get("name", ""), t["tool_call"].get("arguments", {}))
                )
            msgs.append({"role": "assistant", "content": "\n\n".join(p for p in parts if p)})
        elif role == "tool":
            err = t.get("tool_error")
            name = (t.get("error_meta") or {}).get("tool_name", "tool")
            head = f"[TOOL_RESULT name={name} is_error={'true' if err else 'false'}]"
            msgs.append({"role": "user", "content": f"{head}\n{err or t.get('content') or ''}"})
        else:
            msgs.append({"role": "user", "content": t.get("content") or ""})
    return msgs


def build_rows(traces: list[dict], pairs: list[dict]) -> list[dict]:
    """Dataset rows for TRL: ``prompt``, ``reference`` and optionally ``dpo_pair`` / ``error_kind``."""
    rows = []
    for pair in pairs:
        _, messages, chosen, _ = pair_tokens.pair_fields(pair)
        rows.append({"prompt": messages, "reference": chosen, "dpo_pair": pair})
    for trace in traces:
        turns = trace.get("turns") or []
        for i, turn in enumerate(turns):
            if turn.get("role") != "tool" or not turn.get("tool_error"):
                continue
            nxt = next((t for t in turns[i + 1 :] if t.get("role") == "assistant"), None)
            if nxt is None:
                continue
            reference = _turns_to_messages([nxt])[0]["content"]
            meta = dict(turn.get("error_meta") or {})
            rows.append(
                {
                    "prompt": _turns_to_messages(turns[: i + 1]),
                    "reference": reference,
                    "error_kind": meta.get("error_kind") or "runtime_error",
                    "error_meta": meta,
                }
            )
    return rows


def fit_prompt(tok: Any, messages: list[dict], max_len: int) -> list[dict]:
    """Drop the oldest messages (a leading system message stays) until the rendered prompt fits
    ``max_len`` tokens; a single message still over the cap keeps the end of its text."""
    msgs = [dict(m) for m in messages]
    keep_first = 1 if msgs and msgs[0].get("role") == "system" else 0
    # Estimate from per-message token counts (one tokenizer call each), then verify by rendering:
    # re-rendering the whole history per dropped message is quadratic on long agent sessions.
    sizes = [len(tok(str(m.get("content", "")), add_special_tokens=False)["input_ids"]) + 8 for m in msgs]
    budget, start = max_len - sum(sizes[:keep_first]), len(msgs)
    while start > keep_first + 1 and budget - sizes[start - 1] >= 0:
        start -= 1
        budget -= sizes[start]
    msgs = msgs[:keep_first] + msgs[min(start, len(msgs) - 1) :]
    while len(pair_tokens.render_prompt_ids(tok, msgs)) > max_len and len(msgs) > keep_first + 1:
        del msgs[keep_first]
    while len(pair_tokens.render_prompt_ids(tok, msgs)) > max_len and len(msgs[-1]["content"]) > 16:
        msgs[-1]["content"] = msgs[-1]["content"][len(msgs[-1]["content"]) // 4 :]
    return msgs


def _completion_text(c: Any) -> str:
    return c[-1]["content"] if isinstance(c, list) else str(c)


def teacher_match_reward(completions: list, reference: list[str], **_: Any) -> list[float]:
    from composer_replication.teacher_replay.actions import canonical_action

    out = []
    for c, ref in zip(completions, reference):
        text = _completion_text(c)
        if canonical_action(text) is not None and canonical_action(text) == canonical_action(ref):
            out.append(1.0)
        else:
            out.append(0.5 * difflib.SequenceMatcher(None, text, ref).ratio())
    return out


def tool_format_reward(completions: list, **_: Any) -> list[float]:
    from composer_replication.teacher_replay.actions import parse_action

    return [1.0 if parse_action(_completion_text(c)).tool_calls else 0.0 for c in completions]


def train_grpo(
    cfg: TrainConfig, *, out_dir: str | Path, resume: bool = False, kill_switch: Any | None = None
) -> dict[str, float]:
    """Run ``ComposerReplicationTrainer`` per ``cfg`` and return TRL's last logged metrics."""
    import torch
    from datasets import Dataset

    from composer_replication._io import JsonlAppender, atomic_write_json
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer
    from composer_replication.trainer.offline import load_model
    from composer_replication.trainer.po_objectives import make_po_config

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
        **g.overrides,
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
    metrics_log = JsonlAppender(out / "metrics.jsonl")
    for row in trainer.state.log_history:
        if "step" in row and "loss" in row:
            metrics_log.write({"step": row["step"], "loss/total": row["loss"], **row})
    metrics_log.close()
    final = {k: float(v) for k, v in trainer.state.log_history[-1].items() if isinstance(v, int | float)}
    atomic_write_json(out / "final_metrics.json", final)
    if cfg.logging.plot:
        from composer_replication.trainer.plots import plot_losses

        plot_losses(out / "metrics.jsonl", out / "losses.png", keys=("loss/total", "sdpo/loss", "pref/loss"))
    return final
