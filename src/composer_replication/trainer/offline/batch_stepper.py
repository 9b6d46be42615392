"""The offline trainer's step over batches the caller builds (the ``smoke`` command, the Monarch recipe).

``batch_stepper(cfg, model, tok, batches)`` returns an ``OfflineStepper`` whose micro-batches come from
``batches`` (an iterator of ``compose_loss`` input dicts, e.g. ``batch.build_batch`` output) instead of
the config's data files: the same ``compose_loss`` call, gradient accumulation, clipping, optimizer, LR
schedule and TAID schedule as ``train_offline``, so no caller writes a training loop of its own.
``batch_config(**sections)`` validates a ``TrainConfig`` that names no data files.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from composer_replication.config import TrainConfig
from composer_replication.trainer.offline.stepper import OfflineStepper

__all__ = ["BatchStepper", "batch_config", "batch_stepper"]


def batch_config(data: dict[str, Any]) -> TrainConfig:
    """A ``TrainConfig`` from a mapping whose batches the caller supplies (no ``data.traces``/``pairs``)."""
    return TrainConfig.model_validate(data, context={"batches": True})


class BatchStepper(OfflineStepper):
    """``OfflineStepper`` drawing each micro-batch from an iterator of ready ``compose_loss`` inputs."""

    def __init__(self, cfg: TrainConfig, model: Any, tok: Any, device: torch.device, batches: Iterator[dict]):
        super().__init__(cfg, model, tok, device, train_traces=[], train_pairs=[])
        self.batches = batches

    def _micro_batch(self) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in next(self.batches).items()}


def batch_stepper(
    cfg: TrainConfig, model: Any, tok: Any, batches: Iterator[dict], device: torch.device | None = None
) -> BatchStepper:
    """The step of ``train_offline`` over ``batches``; ``device`` defaults to the model's."""
    dev = device if device is not None else next(model.parameters()).device
    return BatchStepper(cfg, model, tok, dev, batches)
