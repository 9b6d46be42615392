"""Entropy-aware on-policy distillation (EOPD): forward KL where the teacher is unsure, reverse KL where it is sure.

Paper: Jin, Min, Yang, Kadhe, Zhou, Wei, Baracaldo, Lee, "Entropy-Aware On-Policy Distillation"
(ICML 2026, arXiv 2603.07079). The paper adds a forward-KL term on tokens whose teacher entropy is
high to the reverse-KL objective. This module implements the smooth, per-token form of that idea
that the public API specifies (not the paper's thresholded top-k term, whose exact equation we have
not verified)::

    w_i  = clamp( H(p_T,i) / h_max, 0, 1 )                 h_max defaults to log V
    l_i  = w_i · KL(p_T,i ‖ p_S,i) + (1 - w_i) · KL(p_S,i ‖ p_T,i)

High-entropy tokens lean on forward KL (mode-covering), low-entropy tokens on reverse KL
(mode-seeking). ``w`` is a function of the teacher alone; it is not detached, so a teacher with
gradients would receive them through it (in SDPO the teacher runs under ``no_grad``).

Shapes: ``student_logits_BTV``, ``teacher_logits_BTV`` are ``(B, T, V)``; ``labels_BT`` ``(B, T)``.
"""

from __future__ import annotations

import math

import torch

from composer_replication.opsd import REDUCTIONS, gjsd_per_token, reduce_per_token

__all__ = ["entropy_aware_opd_loss", "teacher_entropy"]


def teacher_entropy(teacher_logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of ``softmax(teacher_logits)`` over the last axis: ``(B, T, V)`` -> ``(B, T)``."""
    if not torch.is_floating_point(teacher_logits):
        raise ValueError(f"teacher_logits has dtype {teacher_logits.dtype}; pass floating-point logits")
    logp = torch.log_softmax(teacher_logits, dim=-1)
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(logp)).sum(-1)


def _check_eopd_args(reduction: str, temperature: float, h_max: float | None) -> None:
    """The argument checks shared with the chunked and fused paths (`kernels.plans.eopd_plan`)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is unknown; use one of {REDUCTIONS}")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    if h_max is not None and not h_max > 0:
        raise ValueError(f"h_max={h_max} must be > 0 nats, or None for log(V)")


def _keep_mask(labels: torch.Tensor) -> torch.Tensor:
    # A 0/1 (or bool) mask as the API states; HF-style labels (-100 = ignore) are accepted too.
    if labels.dtype == torch.bool:
        return labels
    if bool(((labels == 0) | (labels == 1)).all()):
        return labels == 1
    return labels != -100


def entropy_aware_opd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    labels: torch.Tensor | None = None,
    h_max: float | None = None,
    temperature: float = 1.0,
    reduction: str = "batchmean",
) -> torch.Tensor:
    """Entropy-gated mix of forward and reverse KL per token, reduced like :func:`generalized_jsd_loss`.

    Args:
        labels: ``(B, T)`` 0/1 (or bool) mask of the tokens to keep; a tensor with any other values is
            read as HF labels (``-100`` = ignore). None keeps all. Dropped tokens never enter the math.
        h_max: entropy at which a token is pure forward KL; None means ``log V`` (the maximum).
        temperature: applied to both logits before the softmax (and to the entropy gate).
        reduction: ``"batchmean"`` (mean per kept token), ``"sum"``, ``"mean"`` (per element, ÷ N·V),
            ``"none"`` (``(B, T)``, 0 at dropped positions).

    Raises:
        ValueError: shape mismatch (student vs teacher, labels vs the per-token loss), integer logits,
            non-positive ``h_max`` or ``temperature``, or an unknown ``reduction``.
    """
    for name, x in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point logits")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits "
            f"{tuple(teacher_logits.shape)} must have the same (B, T, V) shape"
        )
    lead = student_logits.shape[:-1]
    if labels is not None and tuple(labels.shape) != tuple(lead):
        raise ValueError(f"labels {tuple(labels.shape)} must match the per-token loss shape {tuple(lead)}")
    _check_eopd_args(reduction, temperature, h_max)
    vocab = student_logits.shape[-1]
    h_max = math.log(vocab) if h_max is None else float(h_max)
    s, t = student_logits, teacher_logits
    keep = None
    if labels is not None:
        keep = _keep_mask(labels)
        s, t = s[keep], t[keep]
    s_lp = torch.log_softmax(s / temperature, dim=-1)
    t_lp = torch.log_softmax(t / temperature, dim=-1)
    t_p = t_lp.exp()
    ent = -torch.where(t_p > 0, t_p * t_lp, torch.zeros_like(t_lp)).sum(-1)
    w = (ent / h_max).clamp(0.0, 1.0)
    per_token = w * gjsd_per_token(s_lp, t_lp, 0.0) + (1 - w) * gjsd_per_token(s_lp, t_lp, 1.0)
    if reduction == "none":
        if keep is None:
            return per_token
        return per_token.new_zeros(lead).masked_scatter(keep, per_token)
    n_valid = int(keep.sum()) if keep is not None else per_token.numel()
    return reduce_per_token(per_token, n_valid, vocab, reduction)
