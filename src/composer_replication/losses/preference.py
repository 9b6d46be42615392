"""Preference losses over sequence log-probabilities: sigmoid DPO and SimPO (no vocabulary part).

- DPO: Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly a Reward
  Model" (NeurIPS 2023, arXiv 2305.18290), Eq. 7. Matches TRL 1.16 ``DPOTrainer`` with
  ``loss_type="sigmoid"``, ``f_divergence_type="reverse_kl"`` (``trl/trainer/dpo_trainer.py``)::

      z = β·((log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l)))      (summed log-probs)

- SimPO: Meng, Xia, Chen, "SimPO: Simple Preference Optimization with a Reference-Free Reward"
  (NeurIPS 2024, arXiv 2405.14734), Eq. 6; princeton-nlp/SimPO ``scripts/simpo_trainer.py``, TRL's
  ``CPOTrainer.cpo_loss`` with ``loss_type="simpo"``::

      z = β·(avg_logπ(y_w) - avg_logπ(y_l)) - γ                                (length-normalised)

  with no reference model; ``γ`` is the absolute margin (the SimPO repo's ``gamma_beta_ratio`` is γ/β).

Both: ``L = -(1-ε)·log σ(z) - ε·log σ(-z)`` (ε = label smoothing, default 0), mean over the B pairs.

- RPO: Pang et al., "Iterative Reasoning Preference Optimization" (NeurIPS 2024, arXiv 2404.19733),
  Eq. 1: ``L + α·NLL(y_w)``, the chosen responses' negative log-likelihood (mean over all their tokens
  in the batch, as TRL 1.16 ``DPOTrainer`` with ``rpo_alpha=α`` and ``CPOTrainer``'s ``cpo_alpha`` for
  SimPO). Plain DPO can lower the chosen response's likelihood along with the rejected one's; the NLL term
  keeps it up. ``α = 0`` (the default here) is the plain loss.
Shapes: every log-probability input is ``(B,)``; ``logprobs_BT``, ``mask_BT`` are ``(B, T)``. The
vocabulary-sized part (the sequence log-probs) is `losses.ce.logprobs` on any engine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["VARIANTS", "avg_sequence_logprob", "check_args", "chosen_nll", "dpo_loss", "loss", "simpo_loss"]

VARIANTS = ("dpo", "simpo")


def check_args(variant: str, *refs: torch.Tensor | None) -> None:
    """``variant`` is one of :data:`VARIANTS`; given the reference log-probs (``refs``), DPO needs both."""
    if variant not in VARIANTS:
        raise ValueError(f"dpo_variant={variant!r} is unknown; use one of {VARIANTS}")
    if variant == "dpo" and refs and any(r is None for r in refs):
        raise ValueError(
            "dpo_variant='dpo' needs dpo_chosen_ref_logprobs and dpo_rejected_ref_logprobs (B,): compute them "
            "with sequence_logprobs(ref_model, ...) or build_batch(..., ref_model=...), or use dpo_variant='simpo'"
        )


def _check_floats(named: dict[str, torch.Tensor], what: str) -> None:
    """Every input is a (B,) floating-point tensor with the common B."""
    first = next(iter(named.values()))
    for name, x in named.items():
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point {what}")
        if x.shape != first.shape or x.dim() != 1:
            shapes = {k: tuple(v.shape) for k, v in named.items()}
            raise ValueError(
                f"all inputs must be (B,) with the same B (one value per preference pair); got {shapes}"
            )


def _sigmoid_loss(z: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return losses.sum() / max(losses.numel(), 1)


def _dpo_margin(pc, pr, rc, rr, beta: float) -> torch.Tensor:
    return beta * ((pc - rc) - (pr - rr))


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
    _check_floats(named, "summed log-probabilities")
    z = _dpo_margin(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return _sigmoid_loss(z, label_smoothing)


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
    named = {"chosen_avg_logprobs": chosen_avg_logprobs, "rejected_avg_logprobs": rejected_avg_logprobs}
    _check_floats(named, "log-probabilities")
    return _sigmoid_loss(beta * (chosen_avg_logprobs - rejected_avg_logprobs) - gamma, label_smoothing)


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


def chosen_nll(chosen_logps: torch.Tensor, chosen_tokens: torch.Tensor, *, average: bool) -> torch.Tensor:
    """RPO's NLL term: ``-Σ log π(y_w) / Σ |y_w|`` over the batch (token mean, as TRL's ``nll_loss``).

    ``chosen_logps`` ``(B,)`` are summed (``average=False``, DPO) or per-token mean (``average=True``,
    SimPO) log-probs; ``chosen_tokens`` ``(B,)`` counts each chosen response's scored tokens. 0 (with a
    gradient) when no token is scored.

    Raises:
        ValueError: shapes differ or are not (B,).
    """
    if chosen_logps.dim() != 1 or chosen_tokens.shape != chosen_logps.shape:
        raise ValueError(
            f"chosen_logps {tuple(chosen_logps.shape)} and chosen_tokens {tuple(chosen_tokens.shape)} "
            "must both be (B,)"
        )
    n = chosen_tokens.to(chosen_logps.dtype)
    summed = chosen_logps * n if average else chosen_logps
    return -summed.sum() / n.sum().clamp_min(1)


def loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    *,
    variant: str = "dpo",
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    beta: float = 0.1,
    simpo_beta: float = 2.0,
    simpo_gamma: float = 1.0,
    label_smoothing: float = 0.0,
    rpo_alpha: float = 0.0,
    chosen_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean loss, per-pair margin z)`` of ``variant``: DPO on summed log-probs against the reference's
    (``beta``), or SimPO on mean log-probs (``simpo_beta``, ``simpo_gamma``; references unused); plus
    ``rpo_alpha`` times :func:`chosen_nll` (which needs ``chosen_tokens``) when ``rpo_alpha > 0``.

    Raises:
        ValueError: unknown ``variant``; DPO without both reference log-probs; bad shapes or dtypes;
            ``rpo_alpha`` negative, or positive without ``chosen_tokens``.
    """
    check_args(variant, ref_chosen_logps, ref_rejected_logps)
    if rpo_alpha < 0 or (rpo_alpha > 0 and chosen_tokens is None):
        raise ValueError(
            f"rpo_alpha={rpo_alpha}: use 0 (off) or a positive weight, with chosen_tokens (B,) counting each "
            "chosen response's scored tokens"
        )
    if variant == "simpo":
        value = simpo_loss(
            chosen_logps, rejected_logps, beta=simpo_beta, gamma=simpo_gamma, label_smoothing=label_smoothing
        )
        margin = simpo_beta * (chosen_logps - rejected_logps) - simpo_gamma
    else:
        assert ref_chosen_logps is not None and ref_rejected_logps is not None  # check_args: DPO has both
        ref_c, ref_r = ref_chosen_logps.to(chosen_logps.dtype), ref_rejected_logps.to(chosen_logps.dtype)
        value = dpo_loss(
            chosen_logps, rejected_logps, ref_c, ref_r, beta=beta, label_smoothing=label_smoothing
        )
        margin = _dpo_margin(chosen_logps, rejected_logps, ref_c, ref_r, beta)
    if rpo_alpha > 0:
        assert chosen_tokens is not None
        value = value + rpo_alpha * chosen_nll(chosen_logps, chosen_tokens, average=variant == "simpo")
    return value, margin
