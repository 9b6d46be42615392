"""The loss-seam channels on the memory-efficient paths (used by `composer_replication.loss`).

Every function takes either logits rows (``head=None``: the chunked path) or hidden-state rows plus
an :class:`~composer_replication.kernels.fused_linear.LMHead` (the fused path), and returns exactly
what the corresponding reference computation in `loss.py` returns.
"""

from __future__ import annotations

import torch

from composer_replication.kernels.chunked import (
    chunked_cross_entropy,
    chunked_entropy_aware_opd_loss,
    chunked_generalized_jsd_loss,
    chunked_taid_loss,
    chunked_token_logprobs,
    default_chunk_rows,
)
from composer_replication.kernels.fused_linear import (
    LMHead,
    fused_cross_entropy,
    fused_entropy_aware_opd_loss,
    fused_generalized_jsd_loss,
    fused_taid_loss,
    fused_token_logprobs,
)

__all__ = ["cross_entropy_rows", "sdpo_loss_rows", "sdpo_metrics_rows", "token_logprobs_any"]


def cross_entropy_rows(
    rows: torch.Tensor, labels_N: torch.Tensor, *, head: LMHead | None, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy of (N, V) logits rows, or (N, H) hidden rows through ``head``; 0 if N = 0."""
    if head is None:
        return chunked_cross_entropy(rows, labels_N, label_smoothing=label_smoothing)
    return fused_cross_entropy(rows, head, labels_N, label_smoothing=label_smoothing)


def token_logprobs_any(x_BTX: torch.Tensor, labels_BT: torch.Tensor, *, head: LMHead | None) -> torch.Tensor:
    """(B, T) label log-probs from logits (chunked) or hidden states + head (fused); 0 at -100."""
    if head is None:
        return chunked_token_logprobs(x_BTX, labels_BT)
    return fused_token_logprobs(x_BTX, head, labels_BT)


def sdpo_loss_rows(
    s: torch.Tensor,
    t: torch.Tensor,
    *,
    head: LMHead | None,
    wrapper: str,
    jsd_beta: float,
    temperature: float,
    token_clip: float | None,
    top_k: int | None,
    taid_t: float | None,
    h_max: float | None,
) -> torch.Tensor:
    """`loss.sdpo_channel`'s loss on aligned (1, N, V) logits or (1, N, H) hidden rows."""
    n = s.shape[1]
    if wrapper == "none":
        kw = dict(beta=jsd_beta, temperature=temperature, top_k=top_k, token_clip=token_clip)
        if head is None:
            return chunked_generalized_jsd_loss(s, t, **kw)
        return fused_generalized_jsd_loss(s, t, head, **kw)
    if wrapper == "taid":
        if head is None:
            return chunked_taid_loss(s, t, t=float(taid_t))
        return fused_taid_loss(s, t, head, t=float(taid_t))
    kw = dict(h_max=h_max, temperature=temperature, reduction="none")
    if head is None:
        per_token = chunked_entropy_aware_opd_loss(s, t, **kw)
    else:
        per_token = fused_entropy_aware_opd_loss(s, t, head, **kw)
    if token_clip is not None:
        per_token = per_token.clamp(max=token_clip)
    return per_token.sum() / max(n, 1)


@torch.no_grad()
def sdpo_metrics_rows(s: torch.Tensor, t: torch.Tensor, *, head: LMHead | None) -> dict[str, float]:
    """Teacher entropy (mean) and student/teacher top-1 agreement, one chunk of logits at a time."""
    s2, t2 = s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1])
    n = s2.shape[0]
    if n == 0:
        return {}
    V = head.vocab_size if head is not None else s2.shape[-1]
    ent = agree = 0.0
    step = default_chunk_rows(V)
    for a in range(0, n, step):
        zs, zt = s2[a : a + step], t2[a : a + step]
        if head is not None:
            zs, zt = head.logits(zs), head.logits(zt)
        # entr() is -p log p with 0 at p = 0 (banned, -inf teacher logits do not give nan)
        ent += float(torch.special.entr(torch.softmax(zt.float(), -1)).sum())
        agree += float((zs.argmax(-1) == zt.argmax(-1)).float().sum())
    return {"sdpo/teacher_entropy": ent / n, "sdpo/top1_agreement": agree / n}
