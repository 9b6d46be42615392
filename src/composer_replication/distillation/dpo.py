"""DPO (sigmoid loss) over summed sequence log-ratios: the preference channel with a reference model.

Paper: Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly a Reward
Model" (NeurIPS 2023, arXiv 2305.18290), Eq. 7. Matches TRL 1.16 ``DPOTrainer`` with
``loss_type="sigmoid"``, ``f_divergence_type="reverse_kl"`` (``trl/trainer/dpo_trainer.py``):

    Δ = (log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))
    L = -(1-ε)·log σ(β·Δ) - ε·log σ(-β·Δ)          (ε = label smoothing, default 0)

Log-probabilities are sums over the response tokens. All four inputs are ``(B,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dpo_loss"]


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean sigmoid-DPO loss over the B pairs (0 with a gradient when B = 0).

    Raises:
        ValueError: any input is not a (B,) floating-point tensor with the common B.
    """
    named = {
        "policy_chosen_logps": policy_chosen_logps,
        "policy_rejected_logps": policy_rejected_logps,
        "ref_chosen_logps": ref_chosen_logps,
        "ref_rejected_logps": ref_rejected_logps,
    }
    for name, x in named.items():
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point summed log-probabilities")
        if x.shape != policy_chosen_logps.shape or x.dim() != 1:
            shapes = {k: tuple(v.shape) for k, v in named.items()}
            raise ValueError(f"all DPO inputs must be (B,) with the same B; got {shapes}")
    delta = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    z = beta * delta
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses.sum() / max(losses.numel(), 1)
