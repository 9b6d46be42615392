"""The Composer channels for prime-rl's custom-loss plug point (``[trainer.loss] type = "custom"``).

prime-rl calls ``fn(inputs: LossInputs, **kwargs) -> LossOutputs`` once per sequence of a packed micro-batch
(tensors 1-D over that sequence's tokens) and divides the summed ``loss`` by the global count of loss
tokens. So each function here returns a **sum over its tokens**; prime-rl's division makes it the
per-token mean that `composer_replication.loss` uses. Three entry points, selected by ``import_path``:

- `composer_loss`: prime-rl's default policy term (DPPO-Binary-TV masking + ``kl_tau·log²(π/μ)``)
  plus ``alpha_sdpo`` × self-distillation for sequences that carry a hinted teacher.
- `sdpo_loss`: self-distillation only. With full distributions (``logits`` / ``teacher_logits``, the
  documented extension below) it is exactly `loss.sdpo_channel`'s generalized JSD. With per-token log-probs
  only (stock prime-rl: ``ref_logprobs`` scored by a reference server *with the hint in context*), it is
  the sampled reverse-KL policy gradient ``(log π − log q)·∇log π`` — the same objective as β = 1, in
  expectation.
- `dpo_loss`: one preference pair packed as one sequence (chosen tokens then rejected tokens;
  ``advantages`` = +1 on chosen, −1 on rejected tokens; ``ref_logprobs`` = the reference model's), giving
  `distillation.dpo_loss` on summed log-ratios; returned per pair (see ``docs/recipes.md`` on normalisers).

The ``LossInputs`` / ``LossOutputs`` records below mirror prime-rl's (``src/prime_rl/trainer/rl/loss.py``),
so nothing imports prime-rl; prime-rl's own records work too (attribute access only). ``logits`` and
``teacher_logits`` are an extension: stock prime-rl gives a custom loss log-probs only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from composer_replication.config.loss import JSD_BETA, SDPO_WEIGHT
from composer_replication.loss import ComposedLoss
from composer_replication.opsd import generalized_jsd_loss


@dataclass
class LossInputs:
    """One sequence (1-D over its T tokens), as prime-rl passes it to a custom loss."""

    trainer_logprobs: torch.Tensor  # (T,) log π_θ(token), with grad
    inference_logprobs: torch.Tensor  # (T,) log μ(token) from the inference engine that sampled it
    advantages: torch.Tensor  # (T,)
    loss_mask: torch.Tensor  # (T,) bool
    ref_logprobs: torch.Tensor | None = None  # (T,) reference (or hinted teacher) log-probs
    loss_weights: torch.Tensor | None = None  # (T,)
    logits: torch.Tensor | None = None  # (T, V) extension: the student's logits at these positions
    teacher_logits: torch.Tensor | None = None  # (T, V) extension: the hinted teacher's logits


@dataclass
class LossOutputs:
    loss: torch.Tensor  # scalar: a SUM over this sequence's tokens (prime-rl normalises)
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def _mask(inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    keep_T = inputs.loss_mask.bool()
    w_T = keep_T.to(inputs.trainer_logprobs.dtype)
    if inputs.loss_weights is not None:
        w_T = w_T * inputs.loss_weights.to(w_T.dtype)
    return keep_T, w_T


def sdpo_loss(
    inputs: LossInputs,
    *,
    jsd_beta: float = 0.5,
    temperature: float = 1.0,
    token_clip: float | None = None,
    top_k: int | None = None,
) -> LossOutputs:
    """Self-distillation toward the hinted teacher, summed over the masked tokens (module docstring)."""
    keep_T, w_T = _mask(inputs)
    if inputs.logits is not None and inputs.teacher_logits is not None:
        labels_1T = torch.where(keep_T, 0, -100).unsqueeze(0)
        per_token_1T = generalized_jsd_loss(
            inputs.logits.unsqueeze(0),
            inputs.teacher_logits.detach().unsqueeze(0),
            labels_1T,
            beta=jsd_beta,
            temperature=temperature,
            reduction="none",
            top_k=top_k,
            token_clip=token_clip,
        )
        loss = (per_token_1T[0] * w_T).sum()
        return LossOutputs(loss, {"sdpo/jsd_sum": loss.detach(), "sdpo/tokens": keep_T.sum()})
    if inputs.ref_logprobs is None:
        raise ValueError(
            "sdpo_loss needs the hinted teacher: ref_logprobs (T,) from a reference server scoring with the hint "
            "in context, or logits and teacher_logits (T, V)"
        )
    log_ratio_T = (inputs.trainer_logprobs - inputs.ref_logprobs).detach()
    loss = (log_ratio_T * inputs.trainer_logprobs * w_T).sum()
    return LossOutputs(loss, {"sdpo/reverse_kl_sum": (log_ratio_T * w_T).sum(), "sdpo/tokens": keep_T.sum()})


def dpo_loss(inputs: LossInputs, *, beta: float = 0.1, label_smoothing: float = 0.0) -> LossOutputs:
    """Sigmoid DPO for one pair packed as one sequence (``advantages`` ±1 marks chosen / rejected tokens)."""
    if inputs.ref_logprobs is None:
        raise ValueError(
            "dpo_loss needs ref_logprobs (T,): the reference model's log-probs of the packed pair"
        )
    keep_T, w_T = _mask(inputs)
    sign_T = torch.sign(inputs.advantages).to(w_T.dtype) * w_T
    if not bool((sign_T > 0).any()) or not bool((sign_T < 0).any()):
        raise ValueError(
            "dpo_loss: mark chosen tokens with advantage +1 and rejected tokens with -1 (both needed)"
        )
    logit = beta * (sign_T * (inputs.trainer_logprobs - inputs.ref_logprobs.detach())).sum()
    loss = -(1 - label_smoothing) * F.logsigmoid(logit) - label_smoothing * F.logsigmoid(-logit)
    return LossOutputs(loss, {"pref/margin": logit.detach(), "pref/accuracy": (logit > 0).float().detach()})


def composer_loss(
    inputs: LossInputs,
    *,
    alpha_sdpo: float = SDPO_WEIGHT,
    dppo_mask_low: float = 0.2,
    dppo_mask_high: float = 0.2,
    adv_tau: float = 1.0,
    kl_tau: float = 1e-3,
    jsd_beta: float = JSD_BETA,
    temperature: float = 1.0,
    loss: Mapping[str, Any] | None = None,
) -> LossOutputs:
    """prime-rl's default policy term + ``alpha_sdpo`` × `sdpo_loss` where the sequence has a teacher.

    Policy term per token (prime-rl defaults): ``−keep·adv_tau·A·ratio + kl_tau·log²(π/μ)`` where ``keep``
    masks a token whose trust-region gap ``p_train − p_infer`` exceeds ``dppo_mask_high`` with A > 0 (or is
    below ``−dppo_mask_low`` with A < 0). ``loss`` is a whole ``loss`` config section (``[trainer.loss.kwargs.loss]``
    in prime-rl's TOML; ``sdpo`` is read, the preference channel is `dpo_loss`'s); given, it replaces
    ``alpha_sdpo``, ``jsd_beta`` and ``temperature``. The sum is :meth:`ComposedLoss.total`, as in every trainer.
    """
    composed = ComposedLoss.from_config(
        loss
        if loss is not None
        else {"sdpo": {"weight": alpha_sdpo, "jsd_beta": jsd_beta, "temperature": temperature}}
    )
    keep_T, w_T = _mask(inputs)
    log_ratio_T = inputs.trainer_logprobs - inputs.inference_logprobs.detach()
    ratio_T = torch.exp(log_ratio_T)
    gap_T = (inputs.trainer_logprobs.exp() - inputs.inference_logprobs.exp()).detach()
    adv_T = inputs.advantages
    masked_T = ((adv_T > 0) & (gap_T > dppo_mask_high)) | ((adv_T < 0) & (gap_T < -dppo_mask_low))
    per_token_T = -(~masked_T).to(w_T.dtype) * adv_tau * adv_T * ratio_T + kl_tau * log_ratio_T**2
    policy = (per_token_T * w_T).sum()
    metrics = {"policy/loss_sum": policy.detach(), "policy/masked": (masked_T & keep_T).sum()}
    sdpo = torch.zeros((), dtype=policy.dtype, device=policy.device)
    has_teacher = inputs.teacher_logits is not None or inputs.ref_logprobs is not None
    if composed.sdpo_weight > 0 and has_teacher:
        s = composed.config.sdpo
        sd = sdpo_loss(
            inputs, jsd_beta=s.jsd_beta, temperature=s.temperature, token_clip=s.token_clip, top_k=s.top_k
        )
        sdpo = sd.loss
        metrics |= sd.metrics
    return LossOutputs(composed.total(policy, sdpo, torch.zeros_like(sdpo)), metrics)
