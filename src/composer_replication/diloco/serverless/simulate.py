"""The DiLoCo algorithm in one process: the reference that the distributed replicas must reproduce.

``OuterOptimizer`` is the outer step every replica (and this simulation) applies: it keeps the
global parameters and an SGD (Nesterov) optimiser over them, takes the averaged pseudo-gradient
``mean_i(theta_global - theta_i)`` as the gradient, and steps. ``simulate_diloco`` runs k replicas
one after the other on the same data the distributed replicas see, averaging with the same
:func:`~composer_replication.diloco.serverless.allreduce.fixed_order_mean`. With one intra-op thread
the arithmetic is the same in every process, so the result is bit-identical to a distributed run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from composer_replication.diloco.serverless.allreduce import fixed_order_mean

__all__ = ["OuterOptimizer", "pseudo_gradient", "simulate_diloco", "params_sha256"]


class OuterOptimizer:
    """Global parameters plus the outer SGD (DiLoCo: lr 0.7, momentum 0.9, Nesterov)."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor],
        *,
        lr: float = 0.7,
        momentum: float = 0.9,
        nesterov: bool = True,
    ) -> None:
        self.params = {k: v.detach().clone().float() for k, v in params.items()}
        for p in self.params.values():
            p.requires_grad_(True)
        self.opt = torch.optim.SGD(list(self.params.values()), lr=lr, momentum=momentum, nesterov=nesterov)

    def step(self, avg_delta: Mapping[str, torch.Tensor]) -> None:
        for name, p in self.params.items():
            p.grad = avg_delta[name].to(p.dtype).clone()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Global parameters and momentum buffers, flat, for a checkpoint a late replica can adopt."""
        out = {f"param/{k}": v.detach().clone() for k, v in self.params.items()}
        for k, p in self.params.items():
            buf = self.opt.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                out[f"momentum/{k}"] = buf.detach().clone()
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(tensors[f"param/{k}"])
                if f"momentum/{k}" in tensors:
                    self.opt.state[p]["momentum_buffer"] = tensors[f"momentum/{k}"].clone()

    def load_into(self, model: torch.nn.Module) -> None:
        """Overwrite the model's parameters with the global ones (start of a round)."""
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.params[name])


def pseudo_gradient(
    global_params: Mapping[str, torch.Tensor], model: torch.nn.Module
) -> dict[str, torch.Tensor]:
    """``theta_global - theta_local`` per parameter (the direction the outer step descends)."""
    return {
        name: global_params[name].detach() - p.detach().to(global_params[name].device)
        for name, p in model.named_parameters()
    }


def params_sha256(model_or_params: torch.nn.Module | Mapping[str, torch.Tensor]) -> str:
    """A digest of the exact parameter bits, to compare replicas."""
    import hashlib

    items = (
        model_or_params.named_parameters()
        if isinstance(model_or_params, torch.nn.Module)
        else model_or_params.items()
    )
    h = hashlib.sha256()
    for name, t in sorted(items, key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def simulate_diloco(config: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """Run ``world_size`` DiLoCo replicas sequentially in this process, with the replicas' config.

    Returns ``{"params": global parameters after the last round, "param_sha256", "losses": per
    replica per round mean inner loss, "metrics": per replica per round mean inner metrics (inner:
    offline; else empty dicts)}``. Any ``inner`` mode: each replica gets the same inner loop as the
    distributed replica of that rank.
    """
    from composer_replication.diloco.serverless.replica_entrypoint import ReplicaConfig, build_inner

    cfg = ReplicaConfig.model_validate(dict(config))
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
