"""Synthetic token batches for the ``lm_ce`` inner loop: learnable, and a pure function of their key.

Each batch is a set of arithmetic progressions modulo the vocabulary, drawn from a generator seeded by
(data seed, rank, round, step). Every process that asks for the same key gets the same tokens, so a
distributed run, a restarted replica and the single-process simulation all see identical data.
"""

from __future__ import annotations

import torch

from composer_replication.config.replica import ReplicaConfig

__all__ = ["make_batch"]


def make_batch(cfg: ReplicaConfig, *, rank: int, round_index: int, step: int) -> torch.Tensor:
    """``(batch_size, seq_len)`` token ids for inner step ``step`` of round ``round_index`` on ``rank``."""
    d, v = cfg.data, cfg.model.vocab_size
    g = torch.Generator().manual_seed(
        ((d.seed * 1_000_003 + rank) * 1_000_003 + round_index) * 1_000_003 + step
    )
    start = torch.randint(0, v, (d.batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (d.batch_size, 1), generator=g)
    return (start + stride * torch.arange(d.seq_len)) % v
