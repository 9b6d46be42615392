"""The loss seam: one function per channel of the composed loss, each on the chosen engine.

Trainers call these rather than re-implementing a channel, so that the memory-efficient engines apply
everywhere; `composer_replication.loss.compose_loss` is built from them and re-exports them (the public
path is `composer_replication.loss`). Each channel does the model forward(s) on the path that
``logits_mode`` picks (`kernels.hf.resolve_logits_mode`: full logits, chunked, or fused hidden states +
LM head) and hands the vocabulary-sized part to its family's ``loss(..., engine=)`` in
`composer_replication.losses`. Free of ``trl``; needs only torch.

Token convention: masks (``response_mask``, ``sdpo_loss_mask``) mark *tokens*; the distribution
that predicts the token at position ``p`` is the logits row ``p - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from composer_replication.config.loss import DPO_BETA, JSD_BETA, RPO_ALPHA, SIMPO_BETA, SIMPO_GAMMA
from composer_replication.kernels.chunked import default_chunk_rows
from composer_replication.kernels.fused_linear import LMHead
from composer_replication.kernels.hf import LogitsMode, hidden_states, resolve_logits_mode
from composer_replication.losses import ce, eopd, gjsd, preference, taid
from composer_replication.losses.align import align_sdpo_positions

__all__ = [
    "ChannelResult",
    "check_ids",
    "check_sdpo_wrapper",
    "lm_ce_channel",
    "model_forward",
    "model_logits",
    "preference_channel",
    "sdpo_channel",
    "sdpo_metrics",
    "sequence_logprobs",
]

SDPO_WRAPPERS = ("none", "taid", "entropy_opd")


@dataclass
class ChannelResult:
    """One channel: ``loss`` (scalar, normalised by ``count``), ``count`` (tokens or pairs), metrics."""

    loss: torch.Tensor
    count: int
    metrics: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- forward helpers


def model_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, T, V)`` logits. With an attention mask, position ids count only attended tokens (left padding)."""
    kwargs: dict[str, Any] = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
        kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    if getattr(model, "config", None) is not None:
        kwargs["use_cache"] = False
    return model(input_ids=input_ids, **kwargs).logits


def model_forward(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_mode: str | None
) -> tuple[torch.Tensor, LMHead | None, LogitsMode]:
    """One forward on the chosen path: ``(logits or final hidden states, head or None, engine)``.

    ``engine`` is ``"full"`` / ``"chunked"`` (logits) or ``"fused"`` (hidden states + head); see
    :mod:`composer_replication.kernels.hf` for how ``"auto"`` decides.
    """
    mode, head = resolve_logits_mode(model, logits_mode, input_ids)
    if mode == "fused":
        return hidden_states(model, input_ids, attention_mask), head, mode
    return model_logits(model, input_ids, attention_mask), None, mode


def _given_logits_mode(logits_mode: str | None) -> LogitsMode:
    # Logits passed in by the caller: only the loss computation can still be chunked.
    return "chunked" if logits_mode in ("chunked", "fused") else "full"


def _student_forward(
    where: str,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    hidden: torch.Tensor | None,
    logits: torch.Tensor | None,
    head: LMHead | None,
    logits_mode: str | None,
) -> tuple[torch.Tensor, LMHead | None, LogitsMode]:
    """The student's ``(logits or hidden states, head, engine)``: the caller's ``hidden`` (+ ``head``,
    fused) or ``logits``, else one forward here; ``where`` (e.g. ``"lm_ce_channel(hidden=...)"``)
    names the argument in the error when ``hidden`` comes without ``head``."""
    if hidden is not None:
        if head is None:
            raise ValueError(f"{where} needs head= (kernels.hf.lm_head_of(model))")
        return hidden, head, "fused"
    if logits is not None:
        return logits, head, _given_logits_mode(logits_mode)
    return model_forward(model, input_ids, attention_mask, logits_mode)


def _shifted_labels(input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return input_ids[:, 1:].masked_fill(~mask[:, 1:].bool(), -100)


def check_ids(name: str, ids: torch.Tensor, mask_name: str, mask: torch.Tensor) -> None:
    """``ids`` is a (B, T) integer tensor and ``mask`` has its shape (``ValueError`` naming both)."""
    if torch.is_floating_point(ids) or ids.dim() != 2:
        raise ValueError(
            f"{name} must be a (B, T) integer tensor of token ids; got {ids.dtype} {tuple(ids.shape)}"
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"{mask_name} {tuple(mask.shape)} must have the shape of {name} {tuple(ids.shape)}")


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    average: bool = False,
    logits: torch.Tensor | None = None,
    logits_mode: LogitsMode | None = None,
) -> torch.Tensor:
    """``(B,)`` sum (or, with ``average``, mean) of the response tokens' log-probs under ``model``.

    Pass ``logits`` to reuse a forward already done on ``input_ids``. ``logits_mode`` picks the
    full-logits, chunked or fused-linear path (default ``"auto"``; see docs/large_vocab.md).
    """
    check_ids("input_ids", input_ids, "response_mask", response_mask)
    if logits is None:
        x, head, mode = model_forward(model, input_ids, attention_mask, logits_mode)
    else:
        x, head, mode = logits, None, _given_logits_mode(logits_mode)
    lp = ce.logprobs(x[:, :-1], _shifted_labels(input_ids, response_mask), engine=mode, head=head)
    total = lp.sum(-1)
    if average:
        return total / response_mask[:, 1:].bool().sum(-1).clamp_min(1).to(total.dtype)
    return total


# ----------------------------------------------------------------------------- channel 1


def lm_ce_channel(
    model: Any,
    input_ids: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    logits: torch.Tensor | None = None,
    hidden: torch.Tensor | None = None,
    head: LMHead | None = None,
    logits_mode: LogitsMode | None = None,
) -> ChannelResult:
    """Cross-entropy on the response tokens, mean per response token (0 with a gradient if there are none).

    Reuse a forward with ``logits`` or with final ``hidden`` states + ``head`` (the fused path);
    otherwise ``logits_mode`` picks the path for the forward done here.
    """
    check_ids("input_ids", input_ids, "response_mask", response_mask)
    x, head, mode = _student_forward(
        "lm_ce_channel(hidden=...)", model, input_ids, attention_mask,
        hidden=hidden, logits=logits, head=head, logits_mode=logits_mode,
    )  # fmt: skip
    keep = response_mask[:, 1:].bool()
    rows = x[:, :-1][keep]
    n = rows.shape[0]
    loss = ce.loss(rows, input_ids[:, 1:][keep], label_smoothing=label_smoothing, engine=mode, head=head)
    return ChannelResult(loss, n, {"lm_ce/tokens": float(n), "lm_ce/loss": float(loss.detach())})


# ----------------------------------------------------------------------------- channel 2


def check_sdpo_wrapper(wrapper: str, taid_t: float | None) -> None:
    """``wrapper`` is one of :data:`SDPO_WRAPPERS`, and ``"taid"`` comes with ``taid_t`` in [0, 1]."""
    if wrapper not in SDPO_WRAPPERS:
        raise ValueError(f"sdpo_wrapper={wrapper!r} is unknown; use one of {SDPO_WRAPPERS}")
    if wrapper != "taid":
        return
    if taid_t is None:
        raise ValueError(
            "sdpo_wrapper='taid' needs taid_t: pass a fixed value in [0, 1] or TAIDScheduler(...).t"
        )
    if not 0.0 <= float(taid_t) <= 1.0:
        raise ValueError(f"taid_t={taid_t} must be in [0, 1] (TAIDScheduler keeps it there)")


@torch.no_grad()
def sdpo_metrics(s: torch.Tensor, t: torch.Tensor, *, engine: str, head: LMHead | None) -> dict[str, float]:
    """Teacher entropy (mean) and student/teacher top-1 agreement over aligned ``(1, N, ·)`` rows.

    ``"full"`` computes them on the given logits at once; the other engines one chunk at a time (from
    hidden rows through ``head`` for ``"fused"``), so no (N, V) tensor is built.
    """
    # entr() is -p log p with 0 at p = 0, so banned (-inf) teacher logits do not give nan
    if engine == "full":
        ent = torch.special.entr(torch.softmax(t.float(), -1)).sum(-1).mean()
        agree = (s.argmax(-1) == t.argmax(-1)).float().mean()
        return {"sdpo/teacher_entropy": float(ent), "sdpo/top1_agreement": float(agree)}
    s2, t2 = s.reshape(-1, s.shape[-1]), t.reshape(-1, t.shape[-1])
    n = s2.shape[0]
    step = default_chunk_rows(head.vocab_size if head is not None else s2.shape[-1])
    ent_sum = agree_sum = 0.0
    for a in range(0, n, step):
        zs, zt = s2[a : a + step], t2[a : a + step]
        if head is not None:
            zs, zt = head.logits(zs), head.logits(zt)
        ent_sum += float(torch.special.entr(torch.softmax(zt.float(), -1)).sum())
        agree_sum += float((zs.argmax(-1) == zt.argmax(-1)).float().sum())
    return {"sdpo/teacher_entropy": ent_sum / n, "sdpo/top1_agreement": agree_sum / n}


def sdpo_channel(
    model: Any,
    input_ids: torch.Tensor,
    ctx_teacher_input_ids: torch.Tensor,
    sdpo_loss_mask: torch.Tensor,
    *,
    response_mask: torch.Tensor | None = None,
    student_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    teacher_attention_mask: torch.Tensor | None = None,
    student_logits: torch.Tensor | None = None,
    wrapper: Literal["none", "taid", "entropy_opd"] = "none",
    jsd_beta: float = JSD_BETA,
    temperature: float = 1.0,
    token_clip: float | None = None,
    top_k: int | None = None,
    taid_t: float | None = None,
    h_max: float | None = None,
    student_hidden: torch.Tensor | None = None,
    head: LMHead | None = None,
    logits_mode: LogitsMode | None = None,
) -> ChannelResult:
    """Self-distillation on the aligned response tokens, mean per token.

    ``student_hidden`` + ``head`` reuse a fused-path forward (the teacher then also runs fused);
    ``logits_mode`` picks the path otherwise (see docs/large_vocab.md).

    Student: ``model(input_ids)`` with grad (or ``student_logits``); teacher: ``model(ctx_teacher_input_ids)``
    under ``no_grad``. Positions come from :func:`align_sdpo_positions`. ``wrapper``: ``"none"`` =
    generalized JSD (``jsd_beta``, ``temperature``, ``token_clip``, ``top_k``); ``"taid"`` = TAID at
    ``taid_t`` (temperature, clip and top-k unused); ``"entropy_opd"`` = entropy-gated KL
    (``temperature``, ``h_max``; ``token_clip`` clamps the per-token value).
    """
    check_sdpo_wrapper(wrapper, taid_t)
    s_mask, t_mask = align_sdpo_positions(
        input_ids, ctx_teacher_input_ids, sdpo_loss_mask, response_mask, student_mask
    )
    student_x, head, mode = _student_forward(
        "sdpo_channel(student_hidden=...)", model, input_ids, attention_mask,
        hidden=student_hidden, logits=student_logits, head=head, logits_mode=logits_mode,
    )  # fmt: skip
    with torch.no_grad():
        if mode == "fused":
            teacher_x = hidden_states(model, ctx_teacher_input_ids, teacher_attention_mask)
        else:
            teacher_x = model_logits(model, ctx_teacher_input_ids, teacher_attention_mask)
    # (1, N, V) logits or (1, N, H) hidden rows, paired in order with t
    s = student_x[:, :-1][s_mask[:, 1:]].unsqueeze(0)
    t = teacher_x[:, :-1][t_mask[:, 1:]].unsqueeze(0).to(s.dtype)
    n = s.shape[1]
    engine: dict[str, Any] = {"engine": mode, "head": head}
    if wrapper == "none":
        loss = gjsd.loss(
            s, t, beta=jsd_beta, temperature=temperature, top_k=top_k, token_clip=token_clip, **engine
        )
    elif wrapper == "taid":
        assert taid_t is not None  # check_sdpo_wrapper: TAID has a t
        loss = taid.loss(s, t, t=float(taid_t), **engine)
    else:
        per_token = eopd.loss(s, t, h_max=h_max, temperature=temperature, reduction="none", **engine)
        if token_clip is not None:
            per_token = per_token.clamp(max=token_clip)
        loss = per_token.sum() / max(n, 1)
    metrics = {"sdpo/tokens": float(n), "sdpo/loss": float(loss.detach())}
    if n:
        metrics.update(sdpo_metrics(s, t, engine=mode, head=head))
    if taid_t is not None and wrapper == "taid":
        metrics["sdpo/taid_t"] = float(taid_t)
    return ChannelResult(loss, n, metrics)


# ----------------------------------------------------------------------------- channel 3


def preference_channel(
    model: Any,
    chosen_input_ids: torch.Tensor,
    chosen_response_mask: torch.Tensor,
    rejected_input_ids: torch.Tensor,
    rejected_response_mask: torch.Tensor,
    *,
    variant: Literal["dpo", "simpo"] = "dpo",
    ref_chosen_logps: torch.Tensor | None = None,
    ref_rejected_logps: torch.Tensor | None = None,
    beta: float = DPO_BETA,
    simpo_beta: float = SIMPO_BETA,
    simpo_gamma: float = SIMPO_GAMMA,
    label_smoothing: float = 0.0,
    chosen_attention_mask: torch.Tensor | None = None,
    rejected_attention_mask: torch.Tensor | None = None,
    logits_mode: LogitsMode | None = None,
    rpo_alpha: float = RPO_ALPHA,
) -> ChannelResult:
    """DPO (summed log-ratios against ``ref_*_logps``) or SimPO (mean log-probs, no reference); mean per pair;
    plus ``rpo_alpha`` times the chosen responses' token-mean NLL (RPO, ``losses.preference.chosen_nll``).

    Chosen and rejected go through the model in one forward (right-padded to a common length).
    """
    preference.check_args(variant)
    check_ids("dpo_chosen_input_ids", chosen_input_ids, "dpo_chosen_response_mask", chosen_response_mask)
    check_ids(
        "dpo_rejected_input_ids", rejected_input_ids, "dpo_rejected_response_mask", rejected_response_mask
    )
    b = chosen_input_ids.shape[0]
    if rejected_input_ids.shape[0] != b:
        raise ValueError(
            f"{b} chosen but {rejected_input_ids.shape[0]} rejected sequences; pass one of each per pair"
        )
    preference.check_args(variant, ref_chosen_logps, ref_rejected_logps)
    length = max(chosen_input_ids.shape[1], rejected_input_ids.shape[1])

    def padded(x: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        return F.pad((torch.ones_like(like) if x is None else x).long(), (0, length - like.shape[1]))

    ids = torch.cat(
        [padded(chosen_input_ids, chosen_input_ids), padded(rejected_input_ids, rejected_input_ids)]
    )
    resp = torch.cat(
        [padded(chosen_response_mask, chosen_input_ids), padded(rejected_response_mask, rejected_input_ids)]
    )
    attn = torch.cat(
        [padded(chosen_attention_mask, chosen_input_ids), padded(rejected_attention_mask, rejected_input_ids)]
    )
    logps = sequence_logprobs(
        model, ids, resp, attention_mask=attn, average=variant == "simpo", logits_mode=logits_mode
    )
    chosen, rejected = logps[:b], logps[b:]
    chosen_tokens = resp[:b, 1:].bool().sum(-1)  # the tokens sequence_logprobs scored
    loss, margin = preference.loss(
        chosen, rejected, variant=variant, ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps, beta=beta, simpo_beta=simpo_beta, simpo_gamma=simpo_gamma,
        label_smoothing=label_smoothing, rpo_alpha=rpo_alpha, chosen_tokens=chosen_tokens,
    )  # fmt: skip
    with torch.no_grad():
        metrics = {
            "pref/pairs": float(b),
            "pref/loss": float(loss.detach()),
            "pref/margin": float(margin.mean()) if b else 0.0,
            "pref/accuracy": float((margin > 0).float().mean()) if b else 0.0,
            "pref/chosen_logps": float(chosen.mean()) if b else 0.0,
            "pref/rejected_logps": float(rejected.mean()) if b else 0.0,
        }
        if rpo_alpha > 0:
            metrics["pref/chosen_nll"] = float(
                preference.chosen_nll(chosen, chosen_tokens, average=variant == "simpo")
            )
    return ChannelResult(loss, b, metrics)
