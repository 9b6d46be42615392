"""The three-channel loss: ``total = lm_ce + alpha_sdpo · sdpo + beta_replay · preference``.

:class:`ComposedLoss` is the loss, built from its config section (``ComposedLoss.from_config(cfg.loss)``,
``config.loss.LossConfig``): it holds the weights and variants, computes each channel, and sums them in
one place (:meth:`ComposedLoss.total`). Every trainer calls it: the offline stepper (on-policy SDPO
samples passed in as the SDPO channel's rows), the GRPO trainer (TRL's policy term as the first
channel) and the prime-rl recipe. :func:`compose_loss` is the flat signature of the API reference, a
thin adapter that builds the config and calls the object; its defaults are the config's.

Channels (each normalised by its own count, so the weights mean the same at any batch shape):

1. ``lm_ce`` — cross-entropy on the student's response tokens, mean per response token.
2. ``sdpo_jsd`` — self-distillation: the same model, given the hint context ``ctx_teacher_input_ids``
   under ``no_grad``, is the teacher on the student's own response tokens. Generalized JSD
   (:mod:`composer_replication.opsd`), or the TAID / entropy-aware wrappers; mean per aligned token.
3. ``trace_replay_dpo`` — preference pairs mined from teacher agreement: sigmoid DPO on summed
   log-ratios (needs precomputed reference log-probs) or SimPO on length-normalised log-probs;
   mean per pair.

The pieces are exposed here as functions (the loss seam, implemented in
:mod:`composer_replication.channels`): :func:`token_logprobs`, :func:`sequence_logprobs`,
:func:`lm_ce_channel`, :func:`sdpo_channel`, :func:`preference_channel`. Trainers call these rather
than re-implementing a channel, so that memory-efficient paths apply everywhere; :func:`compose_loss`
is built from them. The loss families behind them are :mod:`composer_replication.losses`. Free of
``trl``; needs only torch.

Token convention: masks (``response_mask``, ``sdpo_loss_mask``) mark *tokens*; the distribution
that predicts the token at position ``p`` is the logits row ``p - 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from composer_replication.channels import (
    SDPO_WRAPPERS,  # noqa: F401 - allowed sdpo_wrapper values
    ChannelResult,
    check_ids,
    check_sdpo_wrapper,
    lm_ce_channel,
    model_forward,
    model_logits,
    preference_channel,
    sdpo_channel,
    sequence_logprobs,
)
from composer_replication.config.loss import (
    DPO_BETA,
    JSD_BETA,
    PREFERENCE_WEIGHT,
    RPO_ALPHA,
    SDPO_WEIGHT,
    SIMPO_BETA,
    SIMPO_GAMMA,
    LossConfig,
)
from composer_replication.kernels.hf import LogitsMode
from composer_replication.losses.align import align_sdpo_positions
from composer_replication.losses.ce import token_logprobs
from composer_replication.losses.preference import VARIANTS as DPO_VARIANTS  # noqa: F401 - dpo_variant values
from composer_replication.losses.preference import check_args as check_preference_args

__all__ = [
    "ChannelResult",
    "ComposedLoss",
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


def _zero(like: torch.Tensor) -> torch.Tensor:
    # A disabled channel: a zero that still participates in autograd (total.backward() works as usual).
    return torch.zeros((), dtype=like.dtype, device=like.device, requires_grad=True)


def _channel_on(inputs: Mapping[str, Any], keys: tuple[str, ...], channel: str, off_hint: str) -> bool:
    present = [k for k in keys if k in inputs and inputs[k] is not None]
    if present and len(present) < len(keys):
        missing = [k for k in keys if k not in present]
        raise ValueError(
            f"the {channel} channel got {present} but not {missing}; pass all of them, or {off_hint}"
        )
    return bool(present)


_RECORDED: Any = object()  # ComposedLoss's default SDPO source: the SDPO keys of the micro-batch itself


@dataclass(frozen=True)
class ComposedLoss:
    """The three-channel loss of one config section: ``primary + α·SDPO + β·preference``.

    ``primary`` is the SFT cross-entropy (:meth:`__call__`) or a policy loss the caller computed (GRPO:
    TRL's term; the prime-rl recipe's). ``logits_mode`` picks the vocabulary path of every channel
    (``None``: ``"auto"``; see :func:`compose_loss`).
    """

    config: LossConfig = field(default_factory=LossConfig)
    logits_mode: LogitsMode | None = None

    @classmethod
    def from_config(
        cls, config: LossConfig | Mapping[str, Any] | None = None, *, logits_mode: LogitsMode | None = None
    ) -> ComposedLoss:
        """From a ``loss`` section (a ``LossConfig`` or its mapping; None: every default)."""
        cfg = config if isinstance(config, LossConfig) else LossConfig.model_validate(dict(config or {}))
        return cls(cfg, logits_mode)

    @property
    def sdpo_weight(self) -> float:
        return self.config.sdpo.weight

    @property
    def preference_weight(self) -> float:
        return self.config.preference.weight

    def total(self, primary: torch.Tensor, sdpo: torch.Tensor, preference: torch.Tensor) -> torch.Tensor:
        """The one place the channels are summed, each already normalised by its own count."""
        return primary + self.sdpo_weight * sdpo + self.preference_weight * preference

    def sdpo(
        self, model: Any, input_ids: torch.Tensor, ctx_teacher_input_ids: torch.Tensor,
        sdpo_loss_mask: torch.Tensor, *, taid_t: float | None = None, **kw: Any,
    ) -> ChannelResult:  # fmt: skip
        """The SDPO channel with this section's variant (``**kw``: masks and shared forwards of
        :func:`~composer_replication.channels.sdpo_channel`)."""
        s = self.config.sdpo
        kw.setdefault("logits_mode", self.logits_mode)
        return sdpo_channel(
            model, input_ids, ctx_teacher_input_ids, sdpo_loss_mask, wrapper=s.wrapper, jsd_beta=s.jsd_beta,
            temperature=s.temperature, token_clip=s.token_clip, top_k=s.top_k, taid_t=taid_t,
            h_max=s.entropy_opd_h_max, **kw,
        )  # fmt: skip

    def preference(
        self, model: Any, chosen_input_ids: torch.Tensor, chosen_response_mask: torch.Tensor,
        rejected_input_ids: torch.Tensor, rejected_response_mask: torch.Tensor, **kw: Any,
    ) -> ChannelResult:  # fmt: skip
        """The preference channel with this section's variant (``**kw``: reference log-probs, attention
        masks of :func:`~composer_replication.channels.preference_channel`)."""
        p = self.config.preference
        kw.setdefault("logits_mode", self.logits_mode)
        return preference_channel(
            model, chosen_input_ids, chosen_response_mask, rejected_input_ids, rejected_response_mask,
            variant=p.variant, beta=p.dpo_beta, simpo_beta=p.simpo_beta, simpo_gamma=p.simpo_gamma,
            rpo_alpha=p.rpo_alpha, **kw,
        )  # fmt: skip

    def __call__(
        self, model: Any, inputs: Mapping[str, Any], *, taid_t: float | None = None,
        sdpo_inputs: Mapping[str, Any] | None = _RECORDED,
    ) -> LossComponents:  # fmt: skip
        """SFT CE on ``inputs`` + α·SDPO + β·preference (see :func:`compose_loss` for the keys).

        ``sdpo_inputs`` says where the SDPO channel's rows come from: omitted, the SDPO keys of
        ``inputs`` (recorded responses; the student forward is shared with the CE channel); a batch of
        on-policy samples (``input_ids``, ``ctx_teacher_input_ids``, ``sdpo_loss_mask``, optional
        ``sdpo_student_mask``, ``attention_mask``, ``ctx_teacher_attention_mask``); None, no SDPO rows in
        this micro-batch.
        """
        for key in ("input_ids", "response_mask"):
            if key not in inputs:
                raise ValueError(
                    f"inputs is missing the required key {key!r} (B, T); build it with build_batch(...)"
                )
        input_ids, response_mask = inputs["input_ids"], inputs["response_mask"]
        check_ids("input_ids", input_ids, "response_mask", response_mask)
        attention_mask = inputs.get("attention_mask")
        x, head, mode = model_forward(model, input_ids, attention_mask, self.logits_mode)
        # The student forward is shared by the CE and (recorded) SDPO channels, on the chosen path.
        fwd = {"hidden": x, "head": head} if mode == "fused" else {"logits": x, "logits_mode": mode}
        ce = lm_ce_channel(
            model, input_ids, response_mask, label_smoothing=self.config.label_smoothing, **fwd
        )
        metrics = dict(ce.metrics)
        sdpo_loss = pref_loss = _zero(ce.loss)
        sd = None
        if self.sdpo_weight != 0 and sdpo_inputs is _RECORDED:
            if _channel_on(inputs, SDPO_KEYS, "SDPO", "set alpha_sdpo=0"):
                shared = {"student_hidden": x, "head": head} if mode == "fused" else {"student_logits": x}
                sd = self.sdpo(
                    model, input_ids, inputs["ctx_teacher_input_ids"], inputs["sdpo_loss_mask"], taid_t=taid_t,
                    response_mask=response_mask, student_mask=inputs.get("sdpo_student_mask"),
                    attention_mask=attention_mask, teacher_attention_mask=inputs.get("ctx_teacher_attention_mask"),
                    logits_mode=mode, **shared,
                )  # fmt: skip
        elif self.sdpo_weight != 0 and sdpo_inputs is not None:
            b = sdpo_inputs
            sd = self.sdpo(
                model, b["input_ids"], b["ctx_teacher_input_ids"], b["sdpo_loss_mask"], taid_t=taid_t,
                student_mask=b.get("sdpo_student_mask"), attention_mask=b.get("attention_mask"),
                teacher_attention_mask=b.get("ctx_teacher_attention_mask"),
            )  # fmt: skip
        if sd is not None:
            sdpo_loss = sd.loss
            metrics.update(sd.metrics)
        if self.preference_weight != 0 and _channel_on(inputs, PAIR_KEYS, "preference", "set beta_replay=0"):
            pr = self.preference(
                model, *(inputs[k] for k in PAIR_KEYS), ref_chosen_logps=inputs.get(REF_KEYS[0]),
                ref_rejected_logps=inputs.get(REF_KEYS[1]),
                chosen_attention_mask=inputs.get("dpo_chosen_attention_mask"),
                rejected_attention_mask=inputs.get("dpo_rejected_attention_mask"), logits_mode=mode,
            )  # fmt: skip
            pref_loss = pr.loss
            metrics.update(pr.metrics)
        return LossComponents(
            lm_ce=ce.loss, sdpo_jsd=sdpo_loss, trace_replay_dpo=pref_loss,
            total=self.total(ce.loss, sdpo_loss, pref_loss), metrics=metrics,
        )  # fmt: skip


def compose_loss(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    alpha_sdpo: float = SDPO_WEIGHT,
    beta_replay: float = PREFERENCE_WEIGHT,
    sdpo_jsd_beta: float = JSD_BETA,
    sdpo_temperature: float = 1.0,
    sdpo_token_clip: float | None = None,
    replay_dpo_beta: float = DPO_BETA,
    lm_ce_label_smoothing: float = 0.0,
    dpo_variant: Literal["dpo", "simpo"] = "dpo",
    sdpo_wrapper: Literal["none", "taid", "entropy_opd"] = "none",
    taid_t: float | None = None,
    simpo_beta: float = SIMPO_BETA,
    simpo_gamma: float = SIMPO_GAMMA,
    entropy_opd_h_max: float | None = None,
    sdpo_top_k: int | None = None,
    logits_mode: LogitsMode | None = None,
    replay_rpo_alpha: float = RPO_ALPHA,
) -> LossComponents:
    """``total = lm_ce + alpha_sdpo · sdpo_jsd + beta_replay · trace_replay_dpo`` (see the module docstring).

    The flat form of :class:`ComposedLoss`: the keyword arguments are the ``loss`` config section's fields
    (``LossConfig.compose_loss_kwargs`` names them) and default to the config's defaults.

    Required keys: ``input_ids``, ``response_mask`` (B, T_s). A channel is off (a zero tensor that still
    takes part in autograd) when its weight is 0 or none of its keys are present; some but not all of its
    keys raise ``ValueError``. SDPO keys: ``ctx_teacher_input_ids``, ``sdpo_loss_mask`` (B, T_t); optional
    ``sdpo_student_mask``, ``attention_mask``, ``ctx_teacher_attention_mask``. Preference keys:
    ``dpo_{chosen,rejected}_{input_ids,response_mask}``, optional ``dpo_{chosen,rejected}_attention_mask``;
    ``dpo_variant="dpo"`` also needs ``dpo_{chosen,rejected}_ref_logprobs`` (SimPO ignores them).
    ``replay_rpo_alpha`` > 0 adds RPO's NLL of the chosen responses to ``trace_replay_dpo``
    (``losses.preference.chosen_nll``; TRL's ``rpo_alpha``); 0 is plain DPO/SimPO.

    ``logits_mode`` (``"auto"`` default, ``"full"``, ``"chunked"``, ``"fused"``) picks how the
    vocabulary-sized part is computed: ``"fused"`` never builds the (B, T, V) logits, and ``"auto"``
    uses it from a vocabulary of 32768 when the model exposes its LM head (docs/large_vocab.md).
    All paths give the same values and gradients.

    Raises:
        ValueError: unknown ``dpo_variant`` / ``sdpo_wrapper`` / ``logits_mode``; ``taid`` without
            ``taid_t`` or with it outside [0, 1]; missing or mis-shaped inputs; partial channel keys;
            a negative weight or ``replay_rpo_alpha``.
    """
    check_preference_args(dpo_variant)
    check_sdpo_wrapper(sdpo_wrapper, taid_t)
    if replay_rpo_alpha < 0:
        raise ValueError(f"replay_rpo_alpha={replay_rpo_alpha}: use 0 (off) or a positive RPO weight")
    config = LossConfig.from_compose_loss_kwargs(
        alpha_sdpo=alpha_sdpo, beta_replay=beta_replay, lm_ce_label_smoothing=lm_ce_label_smoothing,
        sdpo_wrapper=sdpo_wrapper, sdpo_jsd_beta=sdpo_jsd_beta, sdpo_temperature=sdpo_temperature,
        sdpo_token_clip=sdpo_token_clip, entropy_opd_h_max=entropy_opd_h_max, sdpo_top_k=sdpo_top_k,
        dpo_variant=dpo_variant, replay_dpo_beta=replay_dpo_beta, simpo_beta=simpo_beta,
        simpo_gamma=simpo_gamma, replay_rpo_alpha=replay_rpo_alpha,
    )  # fmt: skip
    return ComposedLoss(config, logits_mode)(model, inputs, taid_t=taid_t)
