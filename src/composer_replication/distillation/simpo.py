"""SimPO: reference-free preference loss with a target margin.

Paper: Meng, Xia, Chen, "SimPO: Simple Preference Optimization with a Reference-Free Reward"
(NeurIPS 2024, arXiv 2405.14734), Eq. 6. Reference code: princeton-nlp/SimPO ``scripts/simpo_trainer.py``;
TRL's equivalent is ``trl.experimental.cpo.CPOTrainer.cpo_loss`` with ``loss_type="simpo"``.

    L = -log σ( β · (avg_logπ(y_w) - avg_logπ(y_l)) - γ )

``avg_logπ`` is the length-normalised (mean per response token) log-probability; there is no
reference model. ``γ`` here is the absolute margin (the SimPO repo's ``gamma_beta_ratio`` is γ/β).

Shapes: ``chosen_avg_logprobs_B``, ``rejected_avg_logprobs_B`` are ``(B,)``; ``logprobs_BT`` and
``mask_BT`` are ``(B, T)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["simpo_loss", "avg_sequence_logprob"]


def _check_pair(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    for name, x in ((name_a, a), (name_b, b)):
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point log-probabilities")
    if a.shape != b.shape or a.dim() != 1:
        raise ValueError(
            f"{name_a} {tuple(a.shape)} and {name_b} {tuple(b.shape)} must both be (B,) with the same B "
            "(one value per preference pair)"
        )


def simpo_loss(
    chosen_avg_logprobs: torch.Tensor,
    rejected_avg_logprobs: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean SimPO loss over the B pairs (0 with a gradient when B = 0).

    ``label_smoothing`` ε gives the conservative form ``-(1-ε)·log σ(z) - ε·log σ(-z)`` of the SimPO repo.

    Raises:
        ValueError: the two inputs are not (B,) float tensors of the same shape.
    """
    _check_pair("chosen_avg_logprobs", chosen_avg_logprobs, "rejected_avg_logprobs", rejected_avg_logprobs)
    z = beta * (chosen_avg_logprobs - rejected_avg_logprobs) - gamma
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses.sum() / max(losses.numel(), 1)


def avg_sequence_logprob(model_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B, T)`` per-token log-probs and ``(B, T)`` 0/1 mask -> ``(B,)`` mean over the masked tokens.

    A row with no masked token gives 0. Masked-out positions never contribute, even if they hold -inf.

    Raises:
        ValueError: shapes differ, or the log-probs are not floating point.
    """
    if not torch.is_floating_point(model_logprobs):
        raise ValueError(
            f"model_logprobs has dtype {model_logprobs.dtype}; pass floating-point log-probabilities"
        )
    if model_logprobs.shape != response_mask.shape or model_logprobs.dim() != 2:
        raise ValueError(
            f"model_logprobs {tuple(model_logprobs.shape)} and response_mask {tuple(response_mask.shape)} "
            "must both be (B, T)"
        )
    m = response_mask.bool()
    summed = torch.where(m, model_logprobs, torch.zeros_like(model_logprobs)).sum(-1)
    return summed / m.sum(-1).clamp_min(1).to(summed.dtype)
