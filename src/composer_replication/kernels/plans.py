"""What each large-vocabulary loss reduces over, shared by the chunked and fused engines.

A *plan* turns a reference loss's arguments (labels, mask, reduction, ``num_items_in_batch``, top-k)
into the rows to compute and the divisor, exactly as the reference reduces; a *row function binder*
fixes a row loss's parameters and, where a closed form exists, attaches ``fn.analytic`` (see
`kernels.analytic`).
"""

from __future__ import annotations

import math

import torch

from composer_replication.kernels.rows import gjsd_rows
from composer_replication.opsd import REDUCTIONS  # noqa: F401 - re-exported

__all__ = ["eopd_plan", "gjsd_plan", "gjsd_row_fn", "reduction_denominator", "taid_plan"]


def reduction_denominator(
    reduction: str, n_valid: int, support: int, num_items_in_batch=None
) -> torch.Tensor | float | None:
    """`opsd.reduce_per_token`'s divisor (None = per-token output for ``"none"``)."""
    if num_items_in_batch is not None:
        return num_items_in_batch
    if reduction == "batchmean":
        return float(max(n_valid, 1))
    if reduction == "sum":
        return 1.0
    if reduction == "mean":
        return float(max(n_valid * support, 1))
    return None


def gjsd_row_fn(beta, temperature, logits_are_probs, top_k, token_clip):
    """The GJSD row function with its parameters bound (shared with `kernels.fused_linear`)."""

    def fn(s, t):
        return gjsd_rows(
            s,
            t,
            beta=beta,
            temperature=temperature,
            logits_are_probs=logits_are_probs,
            top_k=top_k,
            token_clip=token_clip,
        )

    if not logits_are_probs and top_k is None:  # closed form (used by the fused-linear engine)
        from composer_replication.kernels.analytic import gjsd_value_grad

        def analytic(zs, zt, w):
            return gjsd_value_grad(zs, zt, w, beta=beta, temperature=temperature, token_clip=token_clip)

        fn.analytic = analytic
    return fn


def gjsd_plan(lead, V, labels, reduction, top_k, num_items_in_batch, device):
    """(keep mask over the N rows, divisor) for a GJSD call, exactly as the reference reduces."""
    N = math.prod(lead)
    if labels is None:
        keep = torch.ones(N, dtype=torch.bool, device=device)
        n_valid = N
    else:
        keep = (labels != -100).reshape(N)
        n_valid = int(keep.sum())
    support = V if top_k is None else int(top_k)
    return keep, reduction_denominator(reduction, n_valid, support, num_items_in_batch)


def taid_plan(mask: torch.Tensor | None, lead, dtype, device):
    """TAID's masked token mean Σ(ℓ·mask)/Σmask (mask None ⇒ mean over all tokens)."""
    N = math.prod(lead)
    if mask is None:
        return torch.ones(N, dtype=dtype, device=device), float(max(N, 1))
    if tuple(mask.shape) != tuple(lead):
        raise ValueError(f"mask {tuple(mask.shape)} must be {tuple(lead)} (the logits' B, T)")
    w = mask.reshape(N).to(dtype)
    return w, w.sum().clamp_min(1)


def eopd_plan(labels, lead, V, reduction, h_max, temperature, device):
    """(keep mask, divisor, h_max) for entropy-aware OPD, with the reference's checks."""
    from composer_replication.distillation.entropy_aware_opd import _check_eopd_args, _keep_mask

    _check_eopd_args(reduction, temperature, h_max)
    N = math.prod(lead)
    if labels is None:
        keep, n_valid = torch.ones(N, dtype=torch.bool, device=device), N
    else:
        if tuple(labels.shape) != tuple(lead):
            raise ValueError(
                f"labels {tuple(labels.shape)} must match the per-token loss shape {tuple(lead)}"
            )
        keep = _keep_mask(labels).reshape(N)
        n_valid = int(keep.sum())
    hm = math.log(V) if h_max is None else float(h_max)
    return keep, reduction_denominator(reduction, n_valid, V), hm
