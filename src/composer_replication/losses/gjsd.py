"""Generalized Jensen-Shannon divergence (the SDPO / OPSD self-distillation loss), on every engine.

Paper: Agarwal et al., "On-Policy Distillation of Language Models" (GKD, arXiv 2306.13649), Eq. 1;
used for self-distillation by OPSD (Zhao et al., arXiv 2601.18734) and SDPO (Hübotter et al.,
arXiv 2601.20802). The numerics follow TRL's ``GKDTrainer.generalized_jsd_loss`` (trl 1.16,
``trl/experimental/gkd/gkd_trainer.py``) and ``trl.experimental.sdpo.loss_utils.compute_divergence``;
``logits_are_probs`` and ``top_k`` follow OPSD's ``opsd_trainer.py``.

Convention (the one every implementation above uses; ``p_T`` teacher, ``p_S`` student)::

    m      = (1 - beta) * p_S + beta * p_T                 # teacher weighted by beta
    JSD_b  = beta * KL(p_T || m) + (1 - beta) * KL(p_S || m)
    beta=0 -> KL(p_T || p_S)   forward KL, mode-covering  (returned unscaled, as TRL does)
    beta=1 -> KL(p_S || p_T)   reverse KL, mode-seeking   (returned unscaled, as TRL does)

Everything is computed from log-probabilities (``log_softmax`` and ``logsumexp``), so logits of
±1e4 give finite values and gradients. Shapes: ``student_logits_BTV``/``teacher_logits_BTV`` are
``(B, T, V)``; ``labels_BT`` is ``(B, T)``; hidden states ``(B, T, H)``.

This file holds the whole family: the per-token pieces, :func:`check_args`, the row function
:func:`gjsd_rows` with its closed form :func:`gjsd_value_grad`, the chunk :func:`plan`, the reference
:func:`generalized_jsd_loss` and its chunked and fused-linear twins, and :func:`loss` (``engine=``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from composer_replication.kernels.analytic import RowFn, all_finite, log_softmax_
from composer_replication.kernels.chunked import reduce_pair
from composer_replication.kernels.fused_linear import LMHead, hidden_pair
from composer_replication.losses.common import (
    check_engine,
    check_labels,
    check_pair,
    check_reduction,
    kl,
    reference_reduce,
    row_plan,
)

__all__ = [
    "check_args",
    "chunked_generalized_jsd_loss",
    "fused_generalized_jsd_loss",
    "generalized_jsd_loss",
    "gjsd_per_token",
    "gjsd_rows",
    "gjsd_value_grad",
    "log_probs",
    "loss",
    "plan",
    "row_fn",
    "topk_restrict",
]

# ----------------------------------------------------------------------------- per-token pieces


def gjsd_per_token(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalized JSD per token: ``(..., V)`` log-probs -> ``(...)`` divergence summed over V.

    Pure function (no masking, no reduction). ``beta = 0`` is forward KL(T‖S), ``beta = 1`` reverse
    KL(S‖T), otherwise ``beta·KL(T‖m) + (1-beta)·KL(S‖m)`` with the mixture ``m`` formed in log space.
    """
    if beta == 0:
        return kl(teacher_logp, student_logp)
    if beta == 1:
        return kl(student_logp, teacher_logp)
    s_mix, t_mix = student_logp, teacher_logp
    both_zero = torch.isneginf(student_logp) & torch.isneginf(teacher_logp)
    if bool(both_zero.any()):
        # Entries impossible under both (e.g. a banned token's -inf logit): logsumexp(-inf, -inf) has a
        # NaN gradient. Their KL terms are 0 either way (kl masks p = 0), so any finite mixture will do.
        s_mix, t_mix = s_mix.masked_fill(both_zero, 0.0), t_mix.masked_fill(both_zero, 0.0)
    log_mix = torch.logsumexp(torch.stack([s_mix + math.log1p(-beta), t_mix + math.log(beta)]), dim=0)
    return beta * kl(teacher_logp, log_mix) + (1 - beta) * kl(student_logp, log_mix)


def log_probs(x: torch.Tensor, temperature: float = 1.0, logits_are_probs: bool = False) -> torch.Tensor:
    """Tempered log-probabilities over the last axis.

    For logits: ``log_softmax(x / T)``. For probabilities (``logits_are_probs``): ``log(clamp(x, 1e-8))``
    (OPSD's floor), then, when ``T != 1``, renormalised ``p^(1/T)`` — the same distribution that
    ``softmax(logits / T)`` would give if ``x = softmax(logits)``.
    """
    if logits_are_probs:
        logp = x.clamp_min(1e-8).log()
        if temperature != 1.0:
            logp = torch.log_softmax(logp / temperature, dim=-1)
        return logp
    return torch.log_softmax(x / temperature, dim=-1)


def topk_restrict(
    student_logp: torch.Tensor, teacher_logp: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Restrict both distributions to the teacher's top-k tokens and renormalise over those k (no tail bucket).

    This is OPSD's ``top_k_loss``: the divergence is then between the two distributions conditioned on
    the teacher's k most likely tokens. Ties in the teacher are broken by ``torch.topk``.
    """
    idx = teacher_logp.topk(k, dim=-1).indices
    s = torch.log_softmax(student_logp.gather(-1, idx), dim=-1)
    t = torch.log_softmax(teacher_logp.gather(-1, idx), dim=-1)
    return s, t


def check_args(
    beta: float, temperature: float, reduction: str, top_k: int | None, token_clip: float | None, vocab: int
) -> None:
    """The scalar argument checks of every engine (``ValueError`` naming the argument and its range)."""
    check_reduction(reduction)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta} must be in [0, 1] (0 = forward KL, 0.5 = JSD, 1 = reverse KL)")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    if top_k is not None and not 1 <= int(top_k) <= vocab:
        raise ValueError(f"top_k={top_k} must be in [1, V={vocab}], or None for the full vocabulary")
    if token_clip is not None and not token_clip > 0:
        raise ValueError(f"token_clip={token_clip} must be > 0, or None to disable clipping")


# ----------------------------------------------------------------------------- rows, closed form, plan


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
    """Per-row generalized JSD of ``(n, V)`` rows (``top_k`` renormalised, ``token_clip`` caps the value)."""
    s_lp = log_probs(s_nV, temperature, logits_are_probs)
    t_lp = log_probs(t_nV, temperature, logits_are_probs)
    if top_k is not None:
        s_lp, t_lp = topk_restrict(s_lp, t_lp, int(top_k))
    per = gjsd_per_token(s_lp, t_lp, float(beta))
    return per if token_clip is None else per.clamp(max=token_clip)


def gjsd_value_grad(
    zs: torch.Tensor,
    zt: torch.Tensor,
    w: torch.Tensor,
    *,
    beta: float,
    temperature: float = 1.0,
    token_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Closed form of :func:`gjsd_rows` without top-k: ``(ℓ, ∂(Σ w·ℓ)/∂zs)``, in place; None if not finite.

    With ``s``, ``t`` the tempered log-probs, ``p = e^s``, ``q = e^t``: for 0 < β < 1,
    ``log m = logaddexp(s + log(1-β), t + log β)`` and ``∂ℓ/∂z = (1-β)·p·(s - log m - KL(S‖m)) / τ``;
    β = 0: ``∂ℓ/∂z = (p - q) / τ``; β = 1: ``∂ℓ/∂z = p·(s - t - ℓ) / τ``; a row clipped by
    ``token_clip`` takes the value ``clip`` and no gradient (``clamp``'s rule).
    """
    if not all_finite(zs, zt):
        return None
    s = log_softmax_(zs, temperature)
    t = log_softmax_(zt, temperature)
    p = s.exp()
    if beta == 0:
        q = t.exp()
        per = torch.mul(q, t.sub_(s), out=t).sum(-1)  # Σ q (t - s)
        g = p.sub_(q)
    elif beta == 1:
        d = t.neg_().add_(s)  # s - t
        per = torch.mul(p, d, out=s).sum(-1)
        g = d.sub_(per[:, None]).mul_(p)
    else:
        lm = s + math.log1p(-beta)
        lm = torch.logaddexp(lm, t + math.log(beta), out=lm)
        q = t.exp()
        t.sub_(lm)  # t - log m
        v_t = torch.mul(q, t, out=q).sum(-1)
        del q
        s.sub_(lm)  # s - log m
        del lm
        v_s = torch.mul(p, s, out=t).sum(-1)  # KL(S‖m)
        per = beta * v_t + (1 - beta) * v_s
        g = s.sub_(v_s[:, None]).mul_(p).mul_(1 - beta)
    coef = w.to(g.dtype) / temperature
    if token_clip is not None:
        coef = coef * (per <= token_clip).to(g.dtype)
        per = per.clamp(max=token_clip)
    return per, g.mul_(coef[:, None])


def row_fn(
    beta: float, temperature: float, logits_are_probs: bool, top_k: int | None, token_clip: float | None
):
    """:func:`gjsd_rows` with its parameters bound, carrying the closed form where it applies."""
    kw: dict[str, Any] = dict(beta=beta, temperature=temperature, token_clip=token_clip)
    rows = functools.partial(gjsd_rows, logits_are_probs=logits_are_probs, top_k=top_k, **kw)
    closed = not logits_are_probs and top_k is None
    return RowFn(rows, functools.partial(gjsd_value_grad, **kw) if closed else None)


def _keep(labels: torch.Tensor | None) -> torch.Tensor | None:
    """The (B, T) mask of the kept tokens: HF labels, ``-100`` = ignore (None keeps all)."""
    return None if labels is None else labels != -100


def _support(V: int, top_k: int | None) -> int:
    """The entries per token that ``"mean"`` divides by: the vocabulary, or the teacher's ``top_k``."""
    return V if top_k is None else int(top_k)


def plan(lead, V, labels, reduction, top_k, num_items_in_batch, device):
    """(keep mask over the N rows, divisor) for an engine call, exactly as the reference reduces."""
    return row_plan(_keep(labels), lead, reduction, _support(V, top_k), num_items_in_batch, device=device)


# ----------------------------------------------------------------------------- engines


def generalized_jsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    logits_are_probs: bool = False,
    top_k: int | None = None,
    token_clip: float | None = None,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalized JSD between student and teacher next-token distributions (the reference engine).

    Args:
        student_logits: ``(B, T, V)`` student logits (with grad).
        teacher_logits: ``(B, T, V)`` teacher logits (no grad in SDPO; gradients flow if it has them).
        labels: ``(B, T)`` or None. Positions equal to ``-100`` are dropped before any computation, so
            their logits cannot affect the value or the gradient. None keeps every position.
        beta: teacher weight in the mixture; 0 = forward KL(T‖S), 0.5 = JSD, 1 = reverse KL(S‖T).
        temperature: both distributions are ``softmax(logits / temperature)``.
        reduction: over the kept tokens of the vocabulary-summed per-token divergence ``d_i``:
            ``"batchmean"`` = ``Σ d_i / N`` (mean per token; 0 when N = 0, with a gradient),
            ``"sum"`` = ``Σ d_i``, ``"mean"`` = ``Σ d_i / (N·V')`` (element-wise mean, as PyTorch's
            ``kl_div`` and TRL; V' = V or ``top_k``), ``"none"`` = ``(B, T)`` per-token values, 0 at
            ignored positions.
        logits_are_probs: inputs are probabilities (clamped at 1e-8 before the log, as OPSD).
        top_k: keep only the teacher's ``top_k`` tokens per position and renormalise both
            distributions over them (OPSD's ``top_k_loss``; no tail bucket).
        token_clip: clamp each token's vocabulary-summed divergence at this value (a clamped token
            has zero gradient). Unlike OPSD, which clamps each (token, vocabulary-entry) term, this
            caps the per-token divergence itself.
        num_items_in_batch: if given, return ``Σ d_i / num_items_in_batch`` (global-token
            normalisation under gradient accumulation, as TRL); overrides ``reduction``.

    Returns:
        A scalar, or ``(B, T)`` for ``reduction="none"``.

    Differences from TRL's GKD function, on purpose: ``"batchmean"`` without labels is the mean per
    token (TRL divides by B), and ``"none"`` returns per-token ``(B, T)`` values (TRL: element-wise).

    Raises:
        ValueError: unknown reduction; shape mismatch; integer logits; beta, temperature, top_k or
            token_clip out of range.
    """
    check_pair(student_logits, teacher_logits, labels)
    check_args(beta, temperature, reduction, top_k, token_clip, student_logits.shape[-1])
    rows = functools.partial(
        gjsd_rows, beta=beta, temperature=temperature, logits_are_probs=logits_are_probs, top_k=top_k,
        token_clip=token_clip,
    )  # fmt: skip
    support = _support(student_logits.shape[-1], top_k)
    return reference_reduce(
        rows, student_logits, teacher_logits, _keep(labels), reduction, support, num_items_in_batch
    )


def chunked_generalized_jsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    logits_are_probs: bool = False,
    top_k: int | None = None,
    token_clip: float | None = None,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """:func:`generalized_jsd_loss` over token chunks (same values and gradients).

    Peak extra memory is one chunk's temporaries plus the (B, T, V) gradient of the inputs that
    require grad, instead of ~16 (B, T, V) temporaries.
    """
    check_pair(student_logits, teacher_logits, labels)
    check_args(beta, temperature, reduction, top_k, token_clip, student_logits.shape[-1])
    *lead, V = student_logits.shape
    keep, denom = plan(lead, V, labels, reduction, top_k, num_items_in_batch, student_logits.device)
    fn = row_fn(beta, temperature, logits_are_probs, top_k, token_clip)
    return reduce_pair(fn, student_logits, teacher_logits, mask_N=keep, denom=denom, chunk_rows=chunk_rows)


def fused_generalized_jsd_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    head: LMHead,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    top_k: int | None = None,
    token_clip: float | None = None,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``generalized_jsd_loss(head(student_hidden), teacher_head(teacher_hidden), ...)``.

    Same values and gradients, without the (B, T, V) logits. ``teacher_head=None`` uses
    ``head.detached()``: the teacher sends no gradient into the head, as in SDPO where teacher
    logits come from a no-grad forward of the same model.
    """
    V = head.vocab_size
    check_args(beta, temperature, reduction, top_k, token_clip, V)
    pair = hidden_pair(student_hidden, teacher_hidden)
    check_labels(labels, pair.lead)
    keep, denom = plan(pair.lead, V, labels, reduction, top_k, num_items_in_batch, pair.student.device)
    fn = row_fn(beta, temperature, False, top_k, token_clip)
    return pair.reduce(fn, head, teacher_head, mask_N=keep, denom=denom, chunk_rows=chunk_rows)


def loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    logits_are_probs: bool = False,
    top_k: int | None = None,
    token_clip: float | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    engine: str = "full",
    head: LMHead | None = None,
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """The generalized JSD on the chosen engine; every engine gives the reference's values and gradients.

    ``engine="full"`` (:func:`generalized_jsd_loss`) and ``"chunked"`` take ``(B, T, V)`` logits;
    ``"fused"`` takes ``(B, T, H)`` hidden states and ``head`` (``teacher_head`` defaults to
    ``head.detached()``; ``logits_are_probs`` does not apply). ``chunk_rows`` sizes the chunks.
    """
    check_engine(engine, head)
    kw: dict[str, Any] = dict(
        beta=beta, temperature=temperature, reduction=reduction, top_k=top_k, token_clip=token_clip
    )
    if engine == "full":
        return generalized_jsd_loss(
            student,
            teacher,
            labels,
            logits_are_probs=logits_are_probs,
            num_items_in_batch=num_items_in_batch,
            **kw,
        )
    if engine == "chunked":
        return chunked_generalized_jsd_loss(
            student, teacher, labels, logits_are_probs=logits_are_probs,
            num_items_in_batch=num_items_in_batch, chunk_rows=chunk_rows, **kw,
        )  # fmt: skip
    if logits_are_probs:
        raise ValueError(
            "logits_are_probs=True needs logits or probabilities: use engine='full' or 'chunked'"
        )
    assert head is not None  # check_engine: fused has a head
    return fused_generalized_jsd_loss(
        student, teacher, head, labels, num_items_in_batch=num_items_in_batch, teacher_head=teacher_head,
        chunk_rows=chunk_rows, **kw,
    )  # fmt: skip
