"""What a trainer builds from a ``TrainConfig`` before its first step, shared by the offline loop and GRPO:
the model and tokenizer (:func:`load_model`, with LoRA adapters: :func:`apply_lora`), the optimizer and LR
schedule (:func:`make_optimizer`), seeding (:func:`seed_everything`) and TAID's schedule (:func:`make_taid`).
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


def make_taid(cfg: TrainConfig) -> Any:
    """The ``TAIDScheduler`` of ``loss.sdpo`` with ``type: taid`` over ``schedule.max_steps``; else None."""
    s = cfg.loss.sdpo
    if not isinstance(s, TAIDSDPO):
        return None
    from composer_replication.distillation import TAIDScheduler

    return TAIDScheduler(cfg.schedule.max_steps, t_start=s.t_start, t_end=s.t_end, alpha=s.alpha,
                         beta=s.beta, disable_adaptive=s.disable_adaptive)  # fmt: skip
