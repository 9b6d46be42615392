"""The three-channel loss: ``total = lm_ce + alpha_sdpo · sdpo + beta_replay · preference``.

Channels (each normalised by its own count, so the weights mean the same at any batch shape):

1. ``lm_ce`` — cross-entropy on the student's response tokens, mean per response token.
2. ``sdpo_jsd`` — self-distillation: the same model, given the hint context ``ctx_teacher_input_ids``
   under ``no_grad``, is the teacher on the student's own response tokens. Generalized JSD
   (:mod:`composer_replication.opsd`), or the TAID / entropy-aware wrappers; mean per aligned token.
3. ``trace_replay_dpo`` — preference pairs mined from teacher agreement: sigmoid DPO on summed
   log-ratios (needs precomputed reference log-probs) or SimPO on length-normalised log-probs;
   mean per pair.

The pieces are exposed as functions (the loss seam): :func:`token_logprobs`,
:func:`sequence_logprobs`, :func:`lm_ce_channel`, :func:`sdpo_channel`, :func:`preference_channel`.
Trainers call these rather than re-implementing a channel, so that memory-efficient paths apply
everywhere; :func:`compose_loss` is built from them. Free of ``trl``; needs only torch.

Token convention: masks (``response_mask``, ``sdpo_loss_mask``) mark *tokens*; the distribution
that predicts the token at position ``p`` is the logits row ``p - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F

from composer_replication.distillation.dpo import dpo_loss
from composer_replication.distillation.entropy_aware_opd import entropy_aware_opd_loss
from composer_replication.distillation.simpo import simpo_loss
from composer_replication.distillation.taid import taid_loss
from composer_replication.kernels.fused_linear import LMHead
from composer_replication.kernels.hf import LogitsMode, hidden_states, resolve_logits_mode
from composer_replication.kernels.seam import (
    cross_entropy_rows,
    sdpo_loss_rows,
    sdpo_metrics_rows,
    token_logprobs_any,
)
from composer_replication.opsd import align_sdpo_positions, generalized_jsd_loss

__all__ = [
    "ChannelResult",
    "LossComponents",
    "align_sdpo_positions",
    "compose_loss",
    "lm_ce_channel",
    "model_logits",
    "preference_channel",
    "sdpo_channel",
    "sequence_logprobs",
    "token_logprobs",
]

DPO_VARIANTS = ("dpo", "simpo")
SDPO_WRAPPERS = ("none", "taid", "entropy_opd")
SDPO_KEYS = ("ctx_teacher_input_ids", "sdpo_loss_mask")
PAIR_KEYS = (
    "dpo_chosen_input_ids",
    "dpo_chosen_response_mask",
    "dpo_rejected_input_ids",
    "dpo_rejected_response_mask",
)
REF_KEYS = ("dpo_chosen_ref_logprobs", "dpo_rejected_ref_logprobs")


@dataclass
class LossComponents:
    """Per-channel breakdown; all four are scalar tensors and ``total`` carries the gradient.

    ``metrics`` holds namespaced floats computed under ``no_grad`` (``lm_ce/tokens``, ``sdpo/jsd``, ...).
    """

    lm_ce: torch.Tensor
    sdpo_jsd: torch.Tensor
    trace_replay_dpo: torch.Tensor
    total: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)

    def detached(self) -> dict[str, float]:
        """Python floats of the four fields (for logging)."""
        return {
            k: float(getattr(self, k).detach()) for k in ("lm_ce", "sdpo_jsd", "trace_replay_dpo", "total")
        }


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


def _forward(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_mode: str | None
) -> tuple[torch.Tensor, LMHead | None, str]:
    """One forward on the chosen path: ``(logits or final hidden states, head or None, mode)``.

    ``mode`` is ``"full"`` / ``"chunked"`` (logits) or ``"fused"`` (hidden states + head); see
    :mod:`composer_replication.kernels.hf` for how ``"auto"`` decides.
    """
    mode, head = resolve_logits_mode(model, logits_mode, input_ids)
    if mode == "fused":
        return hidden_states(model, input_ids, attention_mask), head, mode
    return model_logits(model, input_ids, attention_mask), None, mode


def _given_logits_mode(logits_mode: str | None) -> str:
    # Logits passed in by the caller: only the loss computation can still be chunked.
    return "chunked" if logits_mode in ("chunked", "fused") else "full"


def token_logprobs(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` per position, ``(B, T)``; 0 where the label is -100.

    Positions must already be aligned (row ``t`` scores ``labels[t]``); computed in at least float32.
    """
    if tuple(logits_BTV.shape[:-1]) != tuple(labels_BT.shape):
        raise ValueError(
            f"logits {tuple(logits_BTV.shape)} and labels {tuple(labels_BT.shape)} disagree on (B, T)"
        )
    logits = logits_BTV.to(torch.promote_types(logits_BTV.dtype, torch.float32))
    ignore = labels_BT == -100
    picked = logits.gather(-1, labels_BT.masked_fill(ignore, 0).unsqueeze(-1)).squeeze(-1)
    return (picked - torch.logsumexp(logits, dim=-1)).masked_fill(ignore, 0.0)


def _shifted_labels(input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return input_ids[:, 1:].masked_fill(~mask[:, 1:].bool(), -100)


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
    _check_ids("input_ids", input_ids, "response_mask", response_mask)
    if logits is None:
        x, head, mode = _forward(model, input_ids, attention_mask, logits_mode)
    else:
        x, head, mode = logits, None, _given_logits_mode(logits_mode)
    labels = _shifted_labels(input_ids, response_mask)
    if mode == "full":
        lp = token_logprobs(x[:, :-1], labels)
    else:
        lp = token_logprobs_any(x[:, :-1], labels, head=head)
    total = lp.sum(-1)
    if average:
        return total / response_mask[:, 1:].bool().sum(-1).clamp_min(1).to(total.dtype)
    return total


def _check_ids(name: str, ids: torch.Tensor, mask_name: str, mask: torch.Tensor) -> None:
    if torch.is_floating_point(ids) or ids.dim() != 2:
        raise ValueError(
            f"{name} must be a (B, T) integer tensor of token ids; got {ids.dtype} {tuple(ids.shape)}"
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"{mask_name} {tuple(mask.shape)} must have the shape of {name} {tuple(ids.shape)}")


def _zero(like: torch.Tensor) -> torch.Tensor:
    # A disabled channel: a zero that still participates in autograd (total.backward() works as usual).
    return torch.zeros((), dtype=like.dtype, device=like.device, requires_grad=True)


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
    _check_ids("input_ids", input_ids, "response_mask", response_mask)
    if hidden is not None:
        if head is None:
            raise ValueError("lm_ce_channel(hidden=...) needs head= (kernels.hf.lm_head_of(model))")
        x, mode = hidden, "fused"
    elif logits is not None:
        x, mode = logits, _given_logits_mode(logits_mode)
    else:
        x, head, mode = _forward(model, input_ids, attention_mask, logits_mode)
    keep = response_mask[:, 1:].bool()
    rows = x[:, :-1][keep]
    n = rows.shape[0]
    if mode == "full":
        rows = rows.to(torch.promote_types(rows.dtype, torch.float32))
        ce_sum = F.cross_entropy(
            rows, input_ids[:, 1:][keep], label_smoothing=label_smoothing, reduction="sum"
        )
        loss = ce_sum / max(n, 1)
    else:
        loss = cross_entropy_rows(rows, input_ids[:, 1:][keep], head=head, label_smoothing=label_smoothing)
    return ChannelResult(loss, n, {"lm_ce/tokens": float(n), "lm_ce/loss": float(loss.detach())})


# ----------------------------------------------------------------------------- channel 2


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
    jsd_beta: float = 0.5,
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
    if wrapper not in SDPO_WRAPPERS:
        raise ValueError(f"sdpo_wrapper={wrapper!r} is unknown; use one of {SDPO_WRAPPERS}")
    if wrapper == "taid":
        _check_taid_t(taid_t)
    s_mask, t_mask = align_sdpo_positions(
        input_ids, ctx_teacher_input_ids, sdpo_loss_mask, response_mask, student_mask
    )
    if student_hidden is not None:
        if head is None:
            raise ValueError("sdpo_channel(student_hidden=...) needs head= (kernels.hf.lm_head_of(model))")
        student_x, mode = student_hidden, "fused"
    elif student_logits is not None:
        student_x, mode = student_logits, _given_logits_mode(logits_mode)
    else:
        student_x, head, mode = _forward(model, input_ids, attention_mask, logits_mode)
    with torch.no_grad():
        if mode == "fused":
            teacher_x = hidden_states(model, ctx_teacher_input_ids, teacher_attention_mask)
        else:
            teacher_x = model_logits(model, ctx_teacher_input_ids, teacher_attention_mask)
    # (1, N, V) logits or (1, N, H) hidden rows, paired in order with t
    s = student_x[:, :-1][s_mask[:, 1:]].unsqueeze(0)
    t = teacher_x[:, :-1][t_mask[:, 1:]].unsqueeze(0).to(s.dtype)
    n = s.shape[1]
    if mode != "full":
        loss = sdpo_loss_rows(
            s, t, head=head, wrapper=wrapper, jsd_beta=jsd_beta, temperature=temperature,
            token_clip=token_clip, top_k=top_k, taid_t=taid_t, h_max=h_max,
        )  # fmt: skip
    elif wrapper == "none":
        loss = generalized_jsd_loss(
            s, t, beta=jsd_beta, temperature=temperature, top_k=top_k, token_clip=token_clip
        )
    elif wrapper == "taid":
        loss = taid_loss(s, t, t=float(taid_t))
    else:
        per_token = entropy_aware_opd_loss(s, t, h_max=h_max, temperature=temperature, reduction="none")
        if token_clip is not None:
            per_token = per_token.clamp(max=token_clip)
        loss = per_token.sum() / max(n, 1)
    metrics = {"sdpo/tokens": float(n), "sdpo/loss": float(loss.detach())}
    with torch.no_grad():
        if n and mode != "full":
            metrics.update(sdpo_metrics_rows(s, t, head=head))
        elif n:
            # entr() is -p log p with 0 at p = 0, so banned (-inf) teacher logits do not give nan
            metrics["sdpo/teacher_entropy"] = float(
                torch.special.entr(torch.softmax(t.float(), -1)).sum(-1).mean()
            )
            agree = s.argmax(-1) == t.argmax(-1)
            metrics["sdpo/top1_agreement"] = float(agree.float().mean())
    if wrapper == "taid":
        metrics["sdpo/taid_t"] = float(taid_t)
    return ChannelResult(loss, n, metrics)


def _check_taid_t(taid_t: float | None) -> None:
    if taid_t is None:
        raise ValueError(
            "sdpo_wrapper='taid' needs taid_t: pass a fixed value in [0, 1] or TAIDScheduler(...).t"
        )
    if not 0.0 <= float(taid_t) <= 1.0:
        raise ValueError(f"taid_t={taid_t} must be in [0, 1] (TAIDScheduler keeps it there)")


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
    beta: float = 0.1,
    simpo_beta: float = 2.0,
    simpo_gamma: float = 1.0,
    label_smoothing: float = 0.0,
    chosen_attention_mask: torch.Tensor | None = None,
    rejected_attention_mask: torch.Tensor | None = None,
    logits_mode: LogitsMode | None = None,
) -> ChannelResult:
    """DPO (summed log-ratios against ``ref_*_logps``) or SimPO (mean log-probs, no reference); mean per pair.

    Chosen and rejected go through the model in one forward (right-padded to a common length).
    """
    if variant not in DPO_VARIANTS:
        raise ValueError(f"dpo_variant={variant!r} is unknown; use one of {DPO_VARIANTS}")
    _check_ids("dpo_chosen_input_ids", chosen_input_ids, "dpo_chosen_response_mask", chosen_response_mask)
    _check_ids(
        "dpo_rejected_input_ids", rejected_input_ids, "dpo_rejected_response_mask", rejected_response_mask
    )
    b = chosen_input_ids.shape[0]
    if rejected_input_ids.shape[0] != b:
        raise ValueError(
            f"{b} chosen but {rejected_input_ids.shape[0]} rejected sequences; pass one of each per pair"
        )
    if variant == "dpo":
        if ref_chosen_logps is None or ref_rejected_logps is None:
            raise ValueError(
                "dpo_variant='dpo' needs dpo_chosen_ref_logprobs and dpo_rejected_ref_logprobs (B,): compute them "
                "with sequence_logprobs(ref_model, ...) or build_batch(..., ref_model=...), or use dpo_variant='simpo'"
            )
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
    if variant == "dpo":
        ref_c = ref_chosen_logps.to(chosen.dtype)
        ref_r = ref_rejected_logps.to(chosen.dtype)
        loss = dpo_loss(chosen, rejected, ref_c, ref_r, beta=beta, label_smoothing=label_smoothing)
        margin = beta * ((chosen - ref_c) - (rejected - ref_r))
    else:
        loss = simpo_loss(
            chosen, rejected, beta=simpo_beta, gamma=simpo_gamma, label_smoothing=label_smoothing
        )
        margin = simpo_beta * (chosen - rejected) - simpo_gamma
    with torch.no_grad():
        metrics = {
            "pref/pairs": float(b),
            "pref/loss": float(loss.detach()),
            "pref/margin": float(margin.mean()) if b else 0.0,
            "pref/accuracy": float((margin > 0).float().mean()) if b else 0.0,
            "pref/chosen_logps": float(chosen.mean()) if b else 0.0,
            "pref/rejected_logps": float(rejected.mean()) if b else 0.0,
        }
    return ChannelResult(loss, b, metrics)


# ----------------------------------------------------------------------------- composition


def _channel_on(inputs: dict[str, torch.Tensor], keys: tuple[str, ...], channel: str, off_hint: str) -> bool:
    present = [k for k in keys if k in inputs and inputs[k] is not None]
    if present and len(present) < len(keys):
        missing = [k for k in keys if k not in present]
        raise ValueError(
            f"the {channel} channel got {present} but not {missing}; pass all of them, or {off_hint}"
        )
    return bool(present)


def compose_loss(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    alpha_sdpo: float = 0.1,
    beta_replay: float = 0.05,
    sdpo_jsd_beta: float = 0.5,
    sdpo_temperature: float = 1.0,
    sdpo_token_clip: float | None = None,
    replay_dpo_beta: float = 0.1,
    lm_ce_label_smoothing: float = 0.0,
    dpo_variant: Literal["dpo", "simpo"] = "dpo",
    sdpo_wrapper: Literal["none", "taid", "entropy_opd"] = "none",
    taid_t: float | None = None,
    simpo_beta: float = 2.0,
    simpo_gamma: float = 1.0,
    entropy_opd_h_max: float | None = None,
    sdpo_top_k: int | None = None,
    logits_mode: LogitsMode | None = None,
) -> LossComponents:
    """``total = lm_ce + alpha_sdpo · sdpo_jsd + beta_replay · trace_replay_dpo`` (see the module docstring).

    Required keys: ``input_ids``, ``response_mask`` (B, T_s). A channel is off (a zero tensor that still
    takes part in autograd) when its weight is 0 or none of its keys are present; some but not all of its
    keys raise ``ValueError``. SDPO keys: ``ctx_teacher_input_ids``, ``sdpo_loss_mask`` (B, T_t); optional
    ``sdpo_student_mask``, ``attention_mask``, ``ctx_teacher_attention_mask``. Preference keys:
    ``dpo_{chosen,rejected}_{input_ids,response_mask}``, optional ``dpo_{chosen,rejected}_attention_mask``;
    ``dpo_variant="dpo"`` also needs ``dpo_{chosen,rejected}_ref_logprobs`` (SimPO ignores them).

    ``logits_mode`` (``"auto"`` default, ``"full"``, ``"chunked"``, ``"fused"``) picks how the
    vocabulary-sized part is computed: ``"fused"`` never builds the (B, T, V) logits, and ``"auto"``
    uses it from a vocabulary of 32768 when the model exposes its LM head (docs/large_vocab.md).
    All paths give the same values and gradients.

    Raises:
        ValueError: unknown ``dpo_variant`` / ``sdpo_wrapper`` / ``logits_mode``; ``taid`` without
            ``taid_t`` or with it outside [0, 1]; missing or mis-shaped inputs; partial channel keys.
    """
    if dpo_variant not in DPO_VARIANTS:
        raise ValueError(f"dpo_variant={dpo_variant!r} is unknown; use one of {DPO_VARIANTS}")
    if sdpo_wrapper not in SDPO_WRAPPERS:
        raise ValueError(f"sdpo_wrapper={sdpo_wrapper!r} is unknown; use one of {SDPO_WRAPPERS}")
    if sdpo_wrapper == "taid":
        _check_taid_t(taid_t)
    for key in ("input_ids", "response_mask"):
        if key not in inputs:
            raise ValueError(
                f"inputs is missing the required key {key!r} (B, T); build it with build_batch(...)"
            )
    input_ids, response_mask = inputs["input_ids"], inputs["response_mask"]
    _check_ids("input_ids", input_ids, "response_mask", response_mask)
    attention_mask = inputs.get("attention_mask")

    x, head, mode = _forward(model, input_ids, attention_mask, logits_mode)
    # The student forward is shared by the CE and SDPO channels, on the chosen path.
    fwd = {"hidden": x, "head": head} if mode == "fused" else {"logits": x, "logits_mode": mode}
    ce = lm_ce_channel(model, input_ids, response_mask, label_smoothing=lm_ce_label_smoothing, **fwd)
    sd_fwd = (
        {"student_hidden": x, "head": head} if mode == "fused" else {"student_logits": x, "logits_mode": mode}
    )
    metrics = dict(ce.metrics)

    sdpo_loss = _zero(ce.loss)
    if alpha_sdpo != 0 and _channel_on(inputs, SDPO_KEYS, "SDPO", "set alpha_sdpo=0"):
        sd = sdpo_channel(
            model, input_ids, inputs["ctx_teacher_input_ids"], inputs["sdpo_loss_mask"],
            response_mask=response_mask, student_mask=inputs.get("sdpo_student_mask"),
            attention_mask=attention_mask, teacher_attention_mask=inputs.get("ctx_teacher_attention_mask"),
            **sd_fwd, wrapper=sdpo_wrapper, jsd_beta=sdpo_jsd_beta, temperature=sdpo_temperature,
            token_clip=sdpo_token_clip, top_k=sdpo_top_k, taid_t=taid_t, h_max=entropy_opd_h_max,
        )  # fmt: skip
        sdpo_loss = sd.loss
        metrics.update(sd.metrics)

    pref_loss = _zero(ce.loss)
    if beta_replay != 0 and _channel_on(inputs, PAIR_KEYS, "preference", "set beta_replay=0"):
        ref_c, ref_r = inputs.get(REF_KEYS[0]), inputs.get(REF_KEYS[1])
        pr = preference_channel(
            model, *(inputs[k] for k in PAIR_KEYS), variant=dpo_variant,
            ref_chosen_logps=ref_c, ref_rejected_logps=ref_r, beta=replay_dpo_beta,
            simpo_beta=simpo_beta, simpo_gamma=simpo_gamma,
            chosen_attention_mask=inputs.get("dpo_chosen_attention_mask"),
            rejected_attention_mask=inputs.get("dpo_rejected_attention_mask"), logits_mode=mode,
        )  # fmt: skip
        pref_loss = pr.loss
        metrics.update(pr.metrics)

    total = ce.loss + alpha_sdpo * sdpo_loss + beta_replay * pref_loss
    return LossComponents(
        lm_ce=ce.loss, sdpo_jsd=sdpo_loss, trace_replay_dpo=pref_loss, total=total, metrics=metrics
    )
