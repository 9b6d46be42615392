"""The DiLoCo outer step, as every object-store replica and the simulation apply it.

DiLoCo (Douillard et al., arXiv 2311.08105): after H inner steps the replicas average the
pseudo-gradient ``theta_global - theta_local`` and take one outer step with SGD (lr 0.7, momentum
0.9, Nesterov) on the global parameters. :class:`OuterOptimizer` holds the global parameters and that
SGD; :func:`pseudo_gradient` computes one replica's contribution; :func:`params_sha256` digests the
exact parameter bits so replicas can be compared. Pure torch, no transport: the object-store sync
(:mod:`composer_replication.diloco.sync_store`) and the single-process simulation
(:mod:`composer_replication.diloco.serverless.simulate`) both build on it. The torchft path uses
torchft's own ``DiLoCo`` (:func:`composer_replication.diloco.make_diloco_outer_loop`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch

__all__ = ["OuterOptimizer", "pseudo_gradient", "params_sha256"]


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
        """One outer step with the averaged pseudo-gradient as the gradient."""
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
        """Adopt a state written by :meth:`state_tensors` (parameters and momentum)."""
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
