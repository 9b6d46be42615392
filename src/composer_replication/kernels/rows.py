"""Row functions: the per-token losses of a (n, V) chunk of logits rows.

Each is the reference loss's per-token formula, written with the reference's own pieces
(`opsd.log_probs`, `opsd.topk_restrict`, `opsd.gjsd_per_token`) so the chunked and fused paths agree
with the full-logits path to rounding. They are pure functions of their rows.
"""

from __future__ import annotations

import torch

__all__ = ["ce_rows", "eopd_rows", "gjsd_rows", "logprob_rows", "taid_rows"]

# ----------------------------------------------------------------------------------------------


def gjsd_rows(
    s_nV: torch.Tensor,
    t_nV: torch.Tensor,
    *,
    beta: float,
    temperature: float = 1.0,
    logits_are_probs: bool = False,
    top_k: int | None = None,
    token_clip: float | None = None,
) -> torch.Tensor:
    """Per-row generalized JSD, built from `opsd`'s own pieces so it matches the reference exactly.

    β = 0 → KL(T‖S), β = 1 → KL(S‖T), otherwise β·KL(T‖m) + (1−β)·KL(S‖m) with
    m = (1−β)·p_S + β·p_T; ``top_k`` = teacher top-k renormalised; ``token_clip`` caps the row value.
    """
    from composer_replication.opsd import gjsd_per_token, log_probs, topk_restrict

    s_lp = log_probs(s_nV, temperature, logits_are_probs)
    t_lp = log_probs(t_nV, temperature, logits_are_probs)
    if top_k is not None:
        s_lp, t_lp = topk_restrict(s_lp, t_lp, int(top_k))
    per = gjsd_per_token(s_lp, t_lp, float(beta))
    return per if token_clip is None else per.clamp(max=token_clip)


def taid_rows(s_nV: torch.Tensor, t_nV: torch.Tensor, *, t: float) -> torch.Tensor:
    """TAID per-row cross-entropy −Σ_v p_t(v)·log q(v), p_t = softmax((1−t)·sg(z_S) + t·z_T).

    Vocabulary entries where the student logit is ±inf contribute 0 (SakanaAI/TAID); at least fp32.
    """
    dtype = torch.promote_types(s_nV.dtype, torch.float32)
    z_s, z_t = s_nV.to(dtype), t_nV.to(dtype)
    p_t = torch.softmax((1 - t) * z_s.detach() + t * z_t, dim=-1)
    logq = torch.log_softmax(z_s, dim=-1)
    prod = torch.where(torch.isinf(z_s), torch.zeros_like(logq), p_t * logq)
    return -prod.sum(-1)


def eopd_rows(
    s_nV: torch.Tensor,
    t_nV: torch.Tensor,
    *,
    h_max: float,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Entropy-gated mix per row: w·KL(T‖S) + (1−w)·KL(S‖T), w = clamp(H_T / h_max, 0, 1)."""
    from composer_replication.opsd import gjsd_per_token

    s_lp = torch.log_softmax(s_nV / temperature, dim=-1)
    t_lp = torch.log_softmax(t_nV / temperature, dim=-1)
    t_p = t_lp.exp()
    ent = -torch.where(t_p > 0, t_p * t_lp, torch.zeros_like(t_lp)).sum(-1)
    w = (ent / h_max).clamp(0.0, 1.0)
    return w * gjsd_per_token(s_lp, t_lp, 0.0) + (1 - w) * gjsd_per_token(s_lp, t_lp, 1.0)


def logprob_rows(z_nV: torch.Tensor, labels_n: torch.Tensor) -> torch.Tensor:
    """log softmax(z)[label] per row (labels must be valid indices)."""
    z = z_nV.float() if z_nV.dtype in (torch.float16, torch.bfloat16) else z_nV
    picked = z.gather(-1, labels_n.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def ce_rows(z_nV: torch.Tensor, labels_n: torch.Tensor, *, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-row cross-entropy with PyTorch's label smoothing: (1−ε)·NLL + ε·mean_v(−log p_v)."""
    z = z_nV.float() if z_nV.dtype in (torch.float16, torch.bfloat16) else z_nV
    lp = torch.log_softmax(z, dim=-1)
    nll = -lp.gather(-1, labels_n.long().unsqueeze(-1)).squeeze(-1)
    if label_smoothing == 0.0:
        return nll
    return (1 - label_smoothing) * nll - label_smoothing * lp.mean(-1)
