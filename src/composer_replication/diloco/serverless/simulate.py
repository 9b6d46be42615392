"""The DiLoCo algorithm in one process: the reference that the distributed replicas must reproduce.

``simulate_diloco`` runs k replicas one after the other on the same data the distributed replicas
see, with the same inner loops (:mod:`composer_replication.diloco.inner`), the same outer step
(:class:`~composer_replication.diloco.outer.OuterOptimizer`) and the same
:func:`~composer_replication.diloco.serverless.allreduce.fixed_order_mean`. With one intra-op thread
the arithmetic is the same in every process, so the result is bit-identical to a distributed run.

Nothing in production imports this module; ``OuterOptimizer``, ``pseudo_gradient`` and
``params_sha256`` are re-exported from :mod:`composer_replication.diloco.outer` for tests and notebooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from composer_replication.config.replica import ReplicaConfig, parse_replica_config
from composer_replication.diloco.inner import build_inner
from composer_replication.diloco.outer import OuterOptimizer, params_sha256, pseudo_gradient
from composer_replication.diloco.serverless.allreduce import fixed_order_mean

__all__ = ["simulate_diloco", "OuterOptimizer", "pseudo_gradient", "params_sha256"]


def simulate_diloco(config: Mapping[str, Any] | ReplicaConfig, world_size: int) -> dict[str, Any]:
    """Run ``world_size`` DiLoCo replicas sequentially in this process, with the replicas' config.

    Returns ``{"params": global parameters after the last round, "param_sha256", "losses": per
    replica per round mean inner loss, "metrics": per replica per round mean inner metrics (inner:
    offline; else empty dicts)}``. Any ``inner`` mode: each replica gets the same inner loop as the
    distributed replica of that rank.
    """
    cfg = parse_replica_config(config)
    torch.set_num_threads(cfg.num_threads)
    replicas = [build_inner(cfg, rank=rank, world_size=world_size) for rank in range(world_size)]
    outer = OuterOptimizer(
        dict(replicas[0].model.named_parameters()),
        lr=cfg.outer_lr,
        momentum=cfg.outer_momentum,
        nesterov=cfg.nesterov,
    )
    losses: list[list[float]] = [[] for _ in range(world_size)]
    metrics: list[list[dict[str, float]]] = [[] for _ in range(world_size)]
    for r in range(cfg.rounds):
        deltas = {}
        for rank, inner in enumerate(replicas):
            outer.load_into(inner.model)
            out = inner.run_round(r)
            losses[rank].append(out["loss"])
            metrics[rank].append(out.get("metrics", {}))
            deltas[rank] = pseudo_gradient(outer.params, inner.model)
        outer.step(fixed_order_mean(deltas))
    return {
        "params": outer.params,
        "param_sha256": params_sha256(outer.params),
        "losses": losses,
        "metrics": metrics,
    }
