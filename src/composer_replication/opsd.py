"""Generalized Jensen-Shannon divergence for on-policy self-distillation (SDPO / OPSD channel).

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
``(B, T, V)``; ``labels_BT`` is ``(B, T)``. Any leading shape ``(..., V)`` works for the pure
per-token function :func:`gjsd_per_token`, which the chunked paths reuse.

:func:`align_sdpo_positions` pairs the student's response tokens with the same tokens in the
hint-augmented teacher context, when the two sequences differ in length.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "align_sdpo_positions",
    "generalized_jsd_loss",
    "gjsd_per_token",
    "log_probs",
    "topk_restrict",
    "reduce_per_token",
]

REDUCTIONS = ("batchmean", "sum", "mean", "none")


def _kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) summed over the last axis, from log-probabilities; 0·log 0 terms are exactly 0."""
    p = logp.exp()
    # where() keeps p = 0 entries (logp = -inf) from turning into 0 * inf = nan, in value and gradient.
    diff = torch.where(p > 0, logp - logq, torch.zeros_like(logp))
    return (p * diff).sum(-1)


def gjsd_per_token(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalized JSD per token: ``(..., V)`` log-probs -> ``(...)`` divergence summed over V.

    Pure function (no masking, no reduction) so that chunked or fused paths can reuse it tile by tile.
    ``beta = 0`` is forward KL(T‖S), ``beta = 1`` reverse KL(S‖T), otherwise
    ``beta·KL(T‖m) + (1-beta)·KL(S‖m)`` with the mixture ``m`` formed in log space.
    """
    if beta == 0:
        return _kl(teacher_logp, student_logp)
    if beta == 1:
        return _kl(student_logp, teacher_logp)
    s_mix, t_mix = student_logp, teacher_logp
    both_zero = torch.isneginf(student_logp) & torch.isneginf(teacher_logp)
    if bool(both_zero.any()):
        # Entries impossible under both (e.g. a banned token's -inf logit): logsumexp(-inf, -inf) has a
        # NaN gradient. Their KL terms are 0 either way (_kl masks p = 0), so any finite mixture will do.
        s_mix, t_mix = s_mix.masked_fill(both_zero, 0.0), t_mix.masked_fill(both_zero, 0.0)
    log_mix = torch.logsumexp(torch.stack([s_mix + math.log1p(-beta), t_mix + math.log(beta)]), dim=0)
    return beta * _kl(teacher_logp, log_mix) + (1 - beta) * _kl(student_logp, log_mix)


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


def reduce_per_token(
    per_token: torch.Tensor,
    n_valid: int,
    support: int,
    reduction: str,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce the divergence of the ``n_valid`` kept tokens (see :func:`generalized_jsd_loss`)."""
    total = per_token.sum()
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    if reduction == "batchmean":
        return total / max(n_valid, 1)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / max(n_valid * support, 1)
    raise ValueError(f"reduction={reduction!r} is not one of {REDUCTIONS}")


def _check(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None,
    beta: float,
    temperature: float,
    reduction: str,
    top_k: int | None,
    token_clip: float | None,
) -> None:
    for name, x in (("student_logits", student_logits), ("teacher_logits", teacher_logits)):
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point logits (e.g. logits.float())")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits {tuple(teacher_logits.shape)} "
            "must have the same (B, T, V) shape; slice both to the same completion positions"
        )
    if labels is not None and tuple(labels.shape) != tuple(student_logits.shape[:-1]):
        raise ValueError(
            f"labels {tuple(labels.shape)} must match the logits' leading shape {tuple(student_logits.shape[:-1])}"
        )
    _check_gjsd_params(beta, temperature, reduction, top_k, token_clip, student_logits.shape[-1])


def _check_gjsd_params(
    beta: float, temperature: float, reduction: str, top_k: int | None, token_clip: float | None, vocab: int
) -> None:
    """The scalar argument checks of the generalized JSD (shared with the chunked and fused paths)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is unknown; use one of {REDUCTIONS}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta} must be in [0, 1] (0 = forward KL, 0.5 = JSD, 1 = reverse KL)")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature} must be > 0")
    if top_k is not None and not 1 <= int(top_k) <= vocab:
        raise ValueError(f"top_k={top_k} must be in [1, V={vocab}], or None for the full vocabulary")
    if token_clip is not None and not token_clip > 0:
        raise ValueError(f"token_clip={token_clip} must be > 0, or None to disable clipping")


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
    """Generalized JSD between student and teacher next-token distributions.

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
    _check(student_logits, teacher_logits, labels, beta, temperature, reduction, top_k, token_clip)
    lead_shape = student_logits.shape[:-1]
    s, t = student_logits, teacher_logits
    keep = None
    if labels is not None:
        keep = labels != -100
        s, t = s[keep], t[keep]  # (N, V): ignored positions never enter the computation
    s_lp = log_probs(s, temperature, logits_are_probs)
    t_lp = log_probs(t, temperature, logits_are_probs)
    support = s_lp.shape[-1]
    if top_k is not None:
        s_lp, t_lp = topk_restrict(s_lp, t_lp, int(top_k))
        support = int(top_k)
    per_token = gjsd_per_token(s_lp, t_lp, float(beta))
    if token_clip is not None:
        per_token = per_token.clamp(max=token_clip)
    if reduction == "none" and num_items_in_batch is None:
        if keep is None:
            return per_token
        out = per_token.new_zeros(lead_shape)
        return out.masked_scatter(keep, per_token)
    n_valid = int(keep.sum()) if keep is not None else per_token.numel()
    return reduce_per_token(per_token, n_valid, support, reduction, num_items_in_batch)


def align_sdpo_positions(
    input_ids: torch.Tensor,
    ctx_teacher_input_ids: torch.Tensor,
    sdpo_loss_mask: torch.Tensor,
    response_mask: torch.Tensor | None = None,
    student_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``(student_mask_BTs, teacher_mask_BTt)`` selecting the same tokens in both sequences.

    The teacher's tokens are those of ``sdpo_loss_mask``. The student's are, in order of preference:
    ``student_mask`` if given; the same positions when both sequences have the same length and the
    tokens there agree (e.g. ``build_batch(align_sdpo_shapes=True)``); otherwise the last ``n_b`` tokens
    of the student's ``response_mask`` in each row ``b`` (``n_b`` = the row's teacher count), i.e. the
    spans are right-aligned — the recovery tokens end both sequences, the hint only sits earlier in the
    teacher's context. The k-th selected student token is paired with the k-th teacher token of the
    row, and their ids must be equal: anything else raises ``ValueError``.
    """
    if torch.is_floating_point(ctx_teacher_input_ids) or ctx_teacher_input_ids.dim() != 2:
        raise ValueError("ctx_teacher_input_ids must be a (B, T_t) integer tensor of token ids")
    if tuple(sdpo_loss_mask.shape) != tuple(ctx_teacher_input_ids.shape):
        raise ValueError(
            f"sdpo_loss_mask {tuple(sdpo_loss_mask.shape)} must have the shape of "
            f"ctx_teacher_input_ids {tuple(ctx_teacher_input_ids.shape)}"
        )
    if input_ids.shape[0] != ctx_teacher_input_ids.shape[0]:
        raise ValueError(
            f"input_ids has B={input_ids.shape[0]} rows but ctx_teacher_input_ids has "
            f"B={ctx_teacher_input_ids.shape[0]}; build one teacher context per student row"
        )
    t_mask = sdpo_loss_mask.bool()
    if bool(t_mask[:, 0].any()):
        raise ValueError(
            "sdpo_loss_mask marks position 0, which no logits predict; mask response tokens only"
        )
    n_t = t_mask.sum(-1)

    def agrees(s_mask: torch.Tensor) -> bool:
        if not torch.equal(s_mask.sum(-1), n_t) or bool(s_mask[:, 0].any()):
            return False
        return torch.equal(input_ids[s_mask], ctx_teacher_input_ids[t_mask])

    if student_mask is not None:
        s_mask = student_mask.bool()
        if tuple(s_mask.shape) != tuple(input_ids.shape) or not agrees(s_mask):
            raise ValueError(
                "sdpo_student_mask must have the shape of input_ids and select, row by row, the same "
                "token ids as sdpo_loss_mask selects in ctx_teacher_input_ids"
            )
        return s_mask, t_mask
    if input_ids.shape == ctx_teacher_input_ids.shape and agrees(t_mask):
        return t_mask, t_mask
    if response_mask is not None:
        resp = response_mask.bool()
        from_end = resp.flip(-1).long().cumsum(-1).flip(-1)  # response tokens at or after each position
        s_mask = resp & (from_end <= n_t.unsqueeze(-1))
        if agrees(s_mask):
            return s_mask, t_mask
    raise ValueError(
        "the tokens selected by sdpo_loss_mask in ctx_teacher_input_ids are not the last response tokens "
        "of input_ids (nor at the same positions); mark the same response tokens in both, or pass "
        "'sdpo_student_mask' (B, T_s) selecting them in input_ids"
    )
