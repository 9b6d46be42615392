"""The inner loops a DiLoCo replica runs between outer syncs (``inner: lm_ce`` or ``inner: offline``).

Each inner loop owns a ``.model`` and ``run_round(round_index) -> {"loss", ["metrics"]}``, which runs
the round's H inner optimizer steps. Both are deterministic given the config, rank and round, which
is what lets the distributed replicas and the simulation agree bit for bit.

- ``lm_ce``: next-token cross-entropy on the configured tiny model and synthetic batches
  (:mod:`.synthetic`), through the loss library's ``token_logprobs``, with AdamW.
- ``offline``: the offline trainer's own step (SFT CE + α·SDPO + β·DPO through ``compose_loss``) via
  :func:`composer_replication.trainer.offline.stepper.make_offline_stepper`, each replica on its shard
  (``rank::world_size``) of the training rows.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from composer_replication.config.replica import ReplicaConfig
from composer_replication.diloco.synthetic import make_batch

__all__ = ["build_replica", "inner_step", "inner_steps", "LmCeInner", "OfflineInner", "build_inner"]


def build_replica(cfg: ReplicaConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (same initial weights on every replica) and its inner AdamW."""
    from composer_replication.models import build_tiny_model

    m = cfg.model
    model = build_tiny_model(
        m.vocab_size,
        arch=m.arch,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads,
        seed=m.seed,
    )
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, betas=(0.9, 0.95), weight_decay=0.1)


def inner_step(
    cfg: ReplicaConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, batch_BT: torch.Tensor
) -> float:
    """One inner optimizer step of next-token cross-entropy; returns the loss."""
    from composer_replication.loss import token_logprobs

    logits_BTV = model(input_ids=batch_BT[:, :-1]).logits
    loss = -token_logprobs(logits_BTV, batch_BT[:, 1:]).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cfg.step_sleep_s:
        time.sleep(cfg.step_sleep_s)
    return float(loss.detach())


def inner_steps(
    cfg: ReplicaConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, *, rank: int, round_index: int
) -> float:
    """H inner steps of round ``round_index``; returns their mean loss."""
    losses = [
        inner_step(cfg, model, opt, make_batch(cfg, rank=rank, round_index=round_index, step=h))
        for h in range(cfg.inner_steps)
    ]
    return sum(losses) / len(losses)


class LmCeInner:
    """``inner: lm_ce``: the tiny model, its AdamW, and batches that are a function of (rank, round, step)."""

    def __init__(self, cfg: ReplicaConfig, rank: int) -> None:
        self.cfg, self.rank = cfg, rank
        self.model, self.opt = build_replica(cfg)

    def run_round(self, round_index: int) -> dict[str, Any]:
        return {"loss": inner_steps(self.cfg, self.model, self.opt, rank=self.rank, round_index=round_index)}


class OfflineInner:
    """``inner: offline``: the offline trainer's stepper on this replica's shard of the data."""

    def __init__(self, cfg: ReplicaConfig, rank: int, world_size: int) -> None:
        from composer_replication.trainer.offline.stepper import make_offline_stepper

        self.cfg = cfg
        self.stepper = make_offline_stepper(cfg.offline_train_config(), shard=(rank, world_size))
        self.model = self.stepper.model

    def run_round(self, round_index: int) -> dict[str, Any]:
        # a replica that adopted a later global state skips the batches of the rounds it missed
        self.stepper.skip_to(round_index * self.cfg.inner_steps)
        rows = []
        for _ in range(self.cfg.inner_steps):
            rows.append(self.stepper.step())
            if self.cfg.step_sleep_s:
                time.sleep(self.cfg.step_sleep_s)
        mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
        return {"loss": mean["loss/total"], "metrics": mean}


def build_inner(cfg: ReplicaConfig, *, rank: int, world_size: int) -> LmCeInner | OfflineInner:
    """The inner loop for ``cfg.inner``: ``.model`` and ``.run_round(r) -> {"loss", ["metrics"]}``."""
    if cfg.inner == "offline":
        return OfflineInner(cfg, rank, world_size)
    return LmCeInner(cfg, rank)
