"""Cross-entropy and label log-probabilities (the LM and preference channels' vocabulary part), on every engine.

- :func:`cross_entropy` — mean cross-entropy over the non-ignored tokens, with PyTorch's label
  smoothing ``(1-ε)·NLL + ε·mean_v(-log p_v)`` (the reference is ``F.cross_entropy``);
- :func:`token_logprobs` — ``log softmax(logits)[label]`` per position, 0 where the label is -100
  (what DPO / SimPO sum over the response tokens).

Each has its row function (:func:`ce_rows`, :func:`logprob_rows`) with a closed form
(:func:`ce_value_grad`: ``∂ℓ/∂z = p - (1-ε)·onehot(y) - ε/V``; :func:`logprob_value_grad`:
``∂ℓ/∂z = onehot(y) - p``), chunked and fused-linear twins, and an ``engine=`` entry
(:func:`loss`, :func:`logprobs`). Shapes: ``logits_NV`` / ``logits_BTV``, labels ``(N,)`` / ``(B, T)``,
hidden states ``(N, H)`` / ``(B, T, H)``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from composer_replication.kernels.analytic import RowFn, all_finite, log_softmax_
from composer_replication.kernels.chunked import as_rows, default_chunk_rows, reduce_rows
from composer_replication.kernels.fused_linear import LMHead, reduce_fused
from composer_replication.losses.common import check_engine

__all__ = [
    "ce_rows",
    "ce_value_grad",
    "chunked_cross_entropy",
    "chunked_token_logprobs",
    "cross_entropy",
    "fused_cross_entropy",
    "fused_token_logprobs",
    "logprob_rows",
    "logprob_value_grad",
    "logprobs",
    "loss",
    "token_logprobs",
]


def _fp32(z: torch.Tensor) -> torch.Tensor:
    return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z


def logprob_rows(z_nV: torch.Tensor, labels_n: torch.Tensor) -> torch.Tensor:
    """log softmax(z)[label] per row (labels must be valid indices), in at least fp32."""
    z = _fp32(z_nV)
    picked = z.gather(-1, labels_n.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def ce_rows(z_nV: torch.Tensor, labels_n: torch.Tensor, *, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-row cross-entropy with PyTorch's label smoothing: (1−ε)·NLL + ε·mean_v(−log p_v)."""
    lp = torch.log_softmax(_fp32(z_nV), dim=-1)
    nll = -lp.gather(-1, labels_n.long().unsqueeze(-1)).squeeze(-1)
    if label_smoothing == 0.0:
        return nll
    return (1 - label_smoothing) * nll - label_smoothing * lp.mean(-1)


def ce_value_grad(
    z: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, *, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Closed form of :func:`ce_rows`: ``(ℓ, ∂(Σ w·ℓ)/∂z)``, in place on ``z``; None if not finite."""
    if not all_finite(z):
        return None
    eps = float(label_smoothing)
    s = log_softmax_(z)
    y = labels.long().unsqueeze(-1)
    per = -s.gather(-1, y).squeeze(-1)
    if eps:
        per = (1 - eps) * per - eps * s.mean(-1)
    g = s.exp_()
    if eps:
        g.sub_(eps / g.shape[-1])
    g.scatter_add_(-1, y, torch.full_like(per, -(1 - eps)).unsqueeze(-1))
    return per, g.mul_(w.to(g.dtype)[:, None])


def logprob_value_grad(
    z: torch.Tensor, labels: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Closed form of :func:`logprob_rows`: ``(log p(label), ∂(Σ w·ℓ)/∂z)``, in place; None if not finite."""
    if not all_finite(z):
        return None
    s = log_softmax_(z)
    y = labels.long().unsqueeze(-1)
    per = s.gather(-1, y).squeeze(-1)
    g = s.exp_().neg_()
    g.scatter_add_(-1, y, torch.ones_like(per).unsqueeze(-1))
    return per, g.mul_(w.to(g.dtype)[:, None])


def _ce_fn(label_smoothing: float):
    return RowFn(
        functools.partial(ce_rows, label_smoothing=label_smoothing),
        functools.partial(ce_value_grad, label_smoothing=label_smoothing),
    )


def _valid(labels: torch.Tensor, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat keep mask, flat labels with ignored entries replaced by a valid index 0)."""
    lab = labels.reshape(-1)
    valid = lab != ignore_index
    return valid, torch.where(valid, lab, torch.zeros_like(lab))


# ----------------------------------------------------------------------------- cross-entropy


def cross_entropy(
    logits_NV: torch.Tensor, labels_N: torch.Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Mean cross-entropy over the non-ignored rows (0 with a gradient when there are none): the reference."""
    z = logits_NV.to(torch.promote_types(logits_NV.dtype, torch.float32))
    n = int((labels_N != ignore_index).sum())
    ce_sum = F.cross_entropy(
        z, labels_N, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    return ce_sum / max(n, 1)


def chunked_cross_entropy(
    logits_NV: torch.Tensor,
    labels_N: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, labels, ignore_index=, label_smoothing=)`` (mean) over chunks."""
    valid, safe = _valid(labels_N, ignore_index)
    return reduce_rows(
        _ce_fn(label_smoothing),
        [as_rows(logits_NV), safe],
        mask_N=valid,
        denom=valid.sum(),
        out_shape=(),
        chunk_rows=chunk_rows or default_chunk_rows(logits_NV.shape[-1]),
    )


def fused_cross_entropy(
    hidden_NH: torch.Tensor,
    head: LMHead,
    labels_N: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(head(hidden), labels, label_smoothing=)`` (mean over non-ignored tokens)."""
    valid, safe = _valid(labels_N, ignore_index)
    pairs = [(hidden_NH.reshape(-1, hidden_NH.shape[-1]), head)]
    return reduce_fused(_ce_fn(label_smoothing), pairs, [safe], valid, valid.sum(), (), chunk_rows)


def loss(
    x: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    engine: str = "full",
    head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy on the chosen engine: ``x`` is ``(N, V)`` logits (``"full"``, ``"chunked"``)
    or ``(N, H)`` hidden states with ``head`` (``"fused"``)."""
    check_engine(engine, head)
    kw: dict[str, Any] = dict(ignore_index=ignore_index, label_smoothing=label_smoothing)
    if engine == "full":
        return cross_entropy(x, labels, **kw)
    if engine == "chunked":
        return chunked_cross_entropy(x, labels, chunk_rows=chunk_rows, **kw)
    assert head is not None  # check_engine: fused has a head
    return fused_cross_entropy(x, head, labels, chunk_rows=chunk_rows, **kw)


# ----------------------------------------------------------------------------- label log-probs


def token_logprobs(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` per position, ``(B, T)``; 0 where the label is -100 (the reference).

    Positions must already be aligned (row ``t`` scores ``labels[t]``); computed in at least float32.
    """
    if tuple(logits_BTV.shape[:-1]) != tuple(labels_BT.shape):
        raise ValueError(
            f"logits {tuple(logits_BTV.shape)} and labels {tuple(labels_BT.shape)} disagree on (B, T)"
        )
    ignore = labels_BT == -100
    return logprob_rows(logits_BTV, labels_BT.masked_fill(ignore, 0)).masked_fill(ignore, 0.0)


def chunked_token_logprobs(
    logits_BTV: torch.Tensor, labels_BT: torch.Tensor, *, chunk_rows: int | None = None
) -> torch.Tensor:
    """:func:`token_logprobs` over token chunks."""
    *lead, V = logits_BTV.shape
    valid, safe = _valid(labels_BT)
    return reduce_rows(
        logprob_rows,
        [as_rows(logits_BTV), safe],
        mask_N=valid,
        denom=None,
        out_shape=tuple(lead),
        chunk_rows=chunk_rows or default_chunk_rows(V),
    )


def fused_token_logprobs(
    hidden_BTH: torch.Tensor, head: LMHead, labels_BT: torch.Tensor, *, chunk_rows: int | None = None
) -> torch.Tensor:
    """:func:`token_logprobs` from hidden states + LM head; ``-100`` labels give 0."""
    lead = tuple(hidden_BTH.shape[:-1])
    valid, safe = _valid(labels_BT)
    fn = RowFn(logprob_rows, logprob_value_grad)
    pairs = [(hidden_BTH.reshape(math.prod(lead), -1), head)]
    return reduce_fused(fn, pairs, [safe], valid, None, lead, chunk_rows)


def logprobs(
    x: torch.Tensor,
    labels: torch.Tensor,
    *,
    engine: str = "full",
    head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """(B, T) label log-probs on the chosen engine: ``x`` is ``(B, T, V)`` logits (``"full"``,
    ``"chunked"``) or ``(B, T, H)`` hidden states with ``head`` (``"fused"``); 0 at -100."""
    check_engine(engine, head)
    if engine == "full":
        return token_logprobs(x, labels)
    if engine == "chunked":
        return chunked_token_logprobs(x, labels, chunk_rows=chunk_rows)
    assert head is not None  # check_engine: fused has a head
    return fused_token_logprobs(x, head, labels, chunk_rows=chunk_rows)
