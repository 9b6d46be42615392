"""Pieces of the offline trainer that do not depend on its loop: model loading, optimizer and LR
schedule, seeding, DPO reference log-probs, pair batches and the ``compose_loss`` keyword arguments.

``trainer.offline`` re-exports ``load_model``, ``reference_logprobs`` and ``pair_batch`` (their old home).
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch

from composer_replication._extras import require
from composer_replication.config import TrainConfig
from composer_replication.config.loss import TAIDSDPO
from composer_replication.trainer import pair_tokens


def load_model(cfg: TrainConfig, device: torch.device) -> tuple[Any, Any]:
    """(model, tokenizer) for ``model.path``: ``tiny``, ``default`` (SmolLM2-135M) or a directory."""
    from composer_replication import models

    dtype = torch.float32
    if cfg.model.dtype == "bfloat16" or (
        cfg.model.dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    ):
        dtype = torch.bfloat16
    # loaded in the training dtype: a 32B model read as fp32 first would need 131 GB per process
    model, tok = models.load_model_and_tokenizer(cfg.model.path, seed=cfg.seed, dtype=dtype)
    model.to(device=device, dtype=dtype)
    if cfg.model.activation_checkpointing:  # each layer recomputed in backward: activations ~ 1/layers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return apply_lora(model, cfg), tok


def apply_lora(model: Any, cfg: TrainConfig) -> Any:
    """``model`` wrapped in a fresh PEFT LoRA adapter when ``cfg.lora.enabled``, else ``model``."""
    if not cfg.lora.enabled:
        return model
    require("trl", "peft", purpose="LoRA")
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        task_type="CAUSAL_LM",
    )
    import warnings

    with warnings.catch_warnings():  # peft asks transformers a deprecated question: not the user's to fix
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(model, lcfg)


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module):
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optimizer
    opt: torch.optim.Optimizer
    if o.type == "sgd":
        opt = torch.optim.SGD(params, lr=o.lr, weight_decay=o.weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, foreach=False)
    s = cfg.schedule

    def factor(step: int) -> float:
        if step < s.warmup_steps:
            return (step + 1) / (s.warmup_steps + 1)
        frac = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
        if s.type == "linear":
            return max(0.0, 1.0 - frac)
        if s.type == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac)))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


@torch.no_grad()
def reference_logprobs(model, tok, pairs: list[dict], max_len: int, batch_size: int = 4) -> dict[str, tuple]:
    """Summed reference log-probs per pair id, with the current (initial) weights; adapters disabled."""
    from contextlib import nullcontext

    from composer_replication.loss import sequence_logprobs

    out: dict[str, tuple[float, float]] = {}
    ctx = model.disable_adapter() if hasattr(model, "peft_config") else nullcontext()
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    with ctx:
        for i in range(0, len(pairs), batch_size):
            enc = pair_tokens.encode_pairs(tok, pairs[i : i + batch_size], max_len)
            c = sequence_logprobs(
                model, enc["dpo_chosen_input_ids"].to(dev), enc["dpo_chosen_response_mask"].to(dev)
            )
            r = sequence_logprobs(
                model, enc["dpo_rejected_input_ids"].to(dev), enc["dpo_rejected_response_mask"].to(dev)
            )
            for pid, a, b in zip(enc["pair_ids"], c.tolist(), r.tolist()):
                out[pid] = (a, b)
    model.train(was_training)
    return out


def pair_batch(tok, rows: list[dict], ref: dict[str, tuple], max_len: int, device) -> dict[str, torch.Tensor]:
    enc = pair_tokens.encode_pairs(tok, rows, max_len)
    vals = torch.tensor([ref[p] for p in enc.pop("pair_ids")], dtype=torch.float32)
    enc["dpo_chosen_ref_logprobs"], enc["dpo_rejected_ref_logprobs"] = vals[:, 0], vals[:, 1]
    return {k: v.to(device) for k, v in enc.items()}


def make_taid(cfg: TrainConfig) -> Any:
    """The ``TAIDScheduler`` of ``loss.sdpo`` with ``type: taid`` over ``schedule.max_steps``; else None."""
    s = cfg.loss.sdpo
    if not isinstance(s, TAIDSDPO):
        return None
    from composer_replication.distillation import TAIDScheduler

    return TAIDScheduler(cfg.schedule.max_steps, t_start=s.t_start, t_end=s.t_end, alpha=s.alpha,
                         beta=s.beta, disable_adaptive=s.disable_adaptive)  # fmt: skip
