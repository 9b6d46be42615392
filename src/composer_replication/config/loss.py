"""The ``loss`` section of the training config: the three channels and their variants.

Each channel with variants is a discriminated union chosen by ``type``, so a variant's knobs exist only
when it is chosen: ``sdpo: {type: taid, t_start: 0.4}``, ``preference: {type: simpo, beta: 2.0}``.
Configs written before the unions (``sdpo: {wrapper: taid, taid: {...}}``, ``preference: {variant:
simpo, simpo_beta: 2}``) still load: ``_legacy_sdpo``/``_legacy_preference`` rewrite them, and a knob
that the chosen variant does not have fails with a message naming the new key.

The read-only properties (``wrapper``, ``entropy_opd_h_max``, ``variant``, ``dpo_beta``, ...) are the
arguments ``compose_loss`` and ``ComposerReplicationTrainer`` take, derived from the chosen variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from composer_replication.config.base import StrictModel

__all__ = [
    "DPO_BETA",
    "JSD_BETA",
    "PREFERENCE_WEIGHT",
    "RPO_ALPHA",
    "SDPO_WEIGHT",
    "SIMPO_BETA",
    "SIMPO_GAMMA",
    "EntropyOPDSDPO",
    "GJSDSDPO",
    "LossConfig",
    "OnPolicyConfig",
    "PreferenceConfig",
    "SDPOConfig",
    "TAIDSDPO",
    "DPOPreference",
    "SimPOPreference",
]


# The loss's defaults, written once: the config fields below and the flat signatures of ``compose_loss``,
# ``ComposerReplicationTrainer`` and the channel functions all read them.
SDPO_WEIGHT = 0.1  # alpha
PREFERENCE_WEIGHT = 0.05  # beta
JSD_BETA = 0.5
DPO_BETA = 0.1
SIMPO_BETA = 2.0
SIMPO_GAMMA = 1.0
# the preference channel's default NLL weight: docs/training.md, "How the defaults were chosen"
RPO_ALPHA = 1.0


class OnPolicyConfig(StrictModel):
    max_new_tokens: int = Field(32, ge=1, le=4096, description="tokens the student samples at an error site")
    temperature: float = Field(1.0, ge=0.0, description="student sampling temperature (0: greedy)")
    sites_per_batch: int = Field(2, ge=1, description="error sites sampled per micro-batch")
    privileged: Literal["none", "recovery"] = Field(
        "recovery",
        description="what the teacher sees beyond the student's context and the hint: the recorded "
        "recovery at the site (OPSD's privileged solution; the default: better on the validation slice "
        "and on held-out sessions, docs/benchmarks/learning.md) or nothing (none)",
    )


class _SDPOBase(StrictModel):
    """Fields every SDPO variant shares."""

    weight: float = Field(
        SDPO_WEIGHT, ge=0.0, description="alpha: weight of the self-distillation channel; 0 disables"
    )
    source: Literal["recorded", "on_policy"] = Field(
        "on_policy",
        description="offline mode: the hinted teacher scores the student's own sample at the error site "
        "(on_policy, OPSD; the default: better on held-out sessions, docs/benchmarks/learning.md) or the "
        "recorded recovery (recorded)",
    )
    on_policy: OnPolicyConfig = Field(default_factory=OnPolicyConfig, description="source=on_policy sampling")
    jsd_beta: float = Field(JSD_BETA, ge=0.0, le=1.0, description="0 forward KL, 0.5 JSD, 1 reverse KL")
    temperature: float = Field(1.0, gt=0.0, description="softmax temperature")
    token_clip: float | None = Field(None, gt=0.0, description="per-token divergence clamp")
    top_k: int | None = Field(
        None, ge=1, description="keep only the teacher's top-k tokens per position (OPSD's top_k_loss)"
    )

    @property
    def wrapper(self) -> Literal["none", "taid", "entropy_opd"]:
        """``compose_loss``'s ``sdpo_wrapper`` for this variant."""
        return "none"

    @property
    def entropy_opd_h_max(self) -> float | None:
        """``compose_loss``'s ``entropy_opd_h_max`` (EOPD only)."""
        return None


class GJSDSDPO(_SDPOBase):
    """Plain generalized JSD between the hinted teacher and the student (the SDPO channel as published)."""

    type: Literal["gjsd"] = Field("gjsd", description="the variant (the default)")


class TAIDSDPO(_SDPOBase):
    """TAID (arXiv 2501.16937): the target interpolates from the student to the teacher on a schedule."""

    type: Literal["taid"] = Field(..., description="the variant")
    t_start: float = Field(0.4, ge=0.0, lt=1.0, description="initial interpolation t")
    t_end: float = Field(1.0, gt=0.0, le=1.0, description="final t (hard ceiling)")
    alpha: float = Field(5e-4, ge=0.0, description="adaptive bump magnitude")
    beta: float = Field(0.99, ge=0.0, lt=1.0, description="EMA decay of the relative loss change")
    disable_adaptive: bool = Field(False, description="plain linear schedule")

    @property
    def wrapper(self) -> Literal["none", "taid", "entropy_opd"]:
        return "taid"


class EntropyOPDSDPO(_SDPOBase):
    """Entropy-aware on-policy distillation: per-token weights from the teacher's entropy."""

    type: Literal["entropy_opd"] = Field(..., description="the variant")
    h_max: float | None = Field(None, gt=0.0, description="entropy normaliser; None = log V")

    @property
    def wrapper(self) -> Literal["none", "taid", "entropy_opd"]:
        return "entropy_opd"

    @property
    def entropy_opd_h_max(self) -> float | None:
        return self.h_max


SDPOConfig = Annotated[GJSDSDPO | TAIDSDPO | EntropyOPDSDPO, Field(discriminator="type")]


class _PreferenceBase(StrictModel):
    weight: float = Field(
        PREFERENCE_WEIGHT, ge=0.0, description="beta: weight of the preference channel; 0 disables"
    )
    rpo_alpha: float = Field(
        RPO_ALPHA,
        ge=0.0,
        description="RPO (arXiv 2404.19733; TRL's rpo_alpha): adds alpha x the chosen responses' NLL to the "
        "preference loss, so the chosen likelihood does not fall with the rejected one; 0: plain DPO/SimPO",
    )

    # ``compose_loss``'s arguments; a variant overrides the ones it sets (others keep the loss defaults).
    @property
    def variant(self) -> Literal["dpo", "simpo"]:
        """``compose_loss``'s ``dpo_variant``."""
        return "dpo"

    @property
    def dpo_beta(self) -> float:
        """``compose_loss``'s ``replay_dpo_beta``."""
        return DPO_BETA

    @property
    def simpo_beta(self) -> float:
        return SIMPO_BETA

    @property
    def simpo_gamma(self) -> float:
        return SIMPO_GAMMA


class DPOPreference(_PreferenceBase):
    """DPO (arXiv 2305.18290) against the reference model's log-probs."""

    type: Literal["dpo"] = Field("dpo", description="the variant (the default)")
    beta: float = Field(DPO_BETA, gt=0.0, description="DPO beta")

    @property
    def dpo_beta(self) -> float:
        return self.beta


class SimPOPreference(_PreferenceBase):
    """SimPO (arXiv 2405.14734): reference-free, length-normalised, with a target margin."""

    type: Literal["simpo"] = Field(..., description="the variant")
    beta: float = Field(SIMPO_BETA, gt=0.0, description="SimPO beta")
    gamma: float = Field(SIMPO_GAMMA, ge=0.0, description="SimPO target margin")

    @property
    def variant(self) -> Literal["dpo", "simpo"]:
        return "simpo"

    @property
    def simpo_beta(self) -> float:
        return self.beta

    @property
    def simpo_gamma(self) -> float:
        return self.gamma


PreferenceConfig = Annotated[DPOPreference | SimPOPreference, Field(discriminator="type")]


_TAID_DEFAULTS = {f: i.default for f, i in TAIDSDPO.model_fields.items() if f not in _SDPOBase.model_fields}
_PREFERENCE_KEYS = {"dpo_beta": ("dpo", "beta", DPO_BETA), "simpo_beta": ("simpo", "beta", SIMPO_BETA),
                    "simpo_gamma": ("simpo", "gamma", SIMPO_GAMMA)}  # fmt: skip


def _typed(
    v: dict[str, Any], old: str, default: str, rename: Callable[[Any], Any] = lambda x: x
) -> tuple[dict[str, Any], str]:
    """A copy of the section with its variant under ``type`` (from the ``old`` key, through ``rename``,
    or ``default``), and that variant; both keys at once is an error."""
    v = dict(v)
    if old in v:
        if "type" in v:
            raise ValueError(f"set `type` only (`{old}` is its old name)")
        v["type"] = rename(v.pop(old))
    return v, v.setdefault("type", default)


def _wrapper_type(w: Any) -> str:
    """The SDPO ``type`` an old ``wrapper`` value names."""
    if w not in ("none", "taid", "entropy_opd"):
        raise ValueError(f"wrapper {w!r}: use type: gjsd, taid or entropy_opd (`wrapper` is its old name)")
    return {"none": "gjsd"}.get(w, w)


def _legacy_sdpo(v: Any) -> Any:
    """``{wrapper: taid, taid: {...}, entropy_opd_h_max: ...}`` (before the union) -> ``{type: ..., ...}``.

    An old file (or an old run's dumped config) carries every variant's knobs; those of another
    variant are dropped when they hold their defaults, and are an error naming the new key otherwise.
    """
    if not isinstance(v, dict):
        return v
    v, kind = _typed(v, "wrapper", "gjsd", _wrapper_type)
    taid = v.pop("taid", None)
    if kind == "taid" and isinstance(taid, dict):
        v = {**taid, **v}
    elif isinstance(taid, dict) and any(
        k not in _TAID_DEFAULTS or _TAID_DEFAULTS[k] != x for k, x in taid.items()
    ):
        raise ValueError("`taid` settings go beside the variant now: sdpo: {type: taid, t_start: 0.4, ...}")
    h_max = v.pop("entropy_opd_h_max", None)
    if kind == "entropy_opd":
        v.setdefault("h_max", h_max)
    elif h_max is not None:
        raise ValueError("`entropy_opd_h_max` is now sdpo: {type: entropy_opd, h_max: ...}")
    return v


def _legacy_preference(v: Any) -> Any:
    """``{variant: simpo, simpo_beta: 2, dpo_beta: 0.1, ...}`` (before the union) -> ``{type: ..., ...}``;
    another variant's knobs are dropped at their defaults and an error naming the new key otherwise."""
    if not isinstance(v, dict):
        return v
    v, kind = _typed(v, "variant", "dpo")
    for old, (variant, new, default) in _PREFERENCE_KEYS.items():
        if old not in v:
            continue
        value = v.pop(old)
        if kind == variant:
            v.setdefault(new, value)
        elif value != default:
            raise ValueError(f"`{old}` is now preference: {{type: {variant}, {new}: {value}}}")
    return v


class LossConfig(StrictModel):
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="label smoothing of the SFT/CE channel")
    sdpo: SDPOConfig = Field(
        default_factory=GJSDSDPO,
        description="self-distillation channel; variant by `type`: gjsd | taid | entropy_opd",
    )
    preference: PreferenceConfig = Field(
        default_factory=DPOPreference, description="preference channel; variant by `type`: dpo | simpo"
    )

    def compose_loss_kwargs(self) -> dict[str, Any]:
        """The channel arguments of ``compose_loss`` (and ``ComposerReplicationTrainer``, which takes the
        same names) for this section; ``taid_t`` comes from the trainer's ``TAIDScheduler``."""
        s, p = self.sdpo, self.preference
        return dict(
            alpha_sdpo=s.weight, beta_replay=p.weight, lm_ce_label_smoothing=self.label_smoothing,
            sdpo_wrapper=s.wrapper, sdpo_jsd_beta=s.jsd_beta, sdpo_temperature=s.temperature,
            sdpo_token_clip=s.token_clip, entropy_opd_h_max=s.entropy_opd_h_max, sdpo_top_k=s.top_k,
            dpo_variant=p.variant, replay_dpo_beta=p.dpo_beta, simpo_beta=p.simpo_beta, simpo_gamma=p.simpo_gamma,
            replay_rpo_alpha=p.rpo_alpha,
        )  # fmt: skip

    @classmethod
    def from_compose_loss_kwargs(
        cls, *, alpha_sdpo: float, beta_replay: float, lm_ce_label_smoothing: float, sdpo_wrapper: str,
        sdpo_jsd_beta: float, sdpo_temperature: float, sdpo_token_clip: float | None,
        entropy_opd_h_max: float | None, sdpo_top_k: int | None, dpo_variant: str, replay_dpo_beta: float,
        simpo_beta: float, simpo_gamma: float, replay_rpo_alpha: float,
    ) -> LossConfig:  # fmt: skip
        """The section that :meth:`compose_loss_kwargs` turns into these arguments (its inverse): what the
        flat signatures of ``compose_loss`` and ``ComposerReplicationTrainer`` build."""
        sdpo: dict[str, Any] = dict(
            type={"none": "gjsd"}.get(sdpo_wrapper, sdpo_wrapper), weight=alpha_sdpo, jsd_beta=sdpo_jsd_beta,
            temperature=sdpo_temperature, token_clip=sdpo_token_clip, top_k=sdpo_top_k,
        )  # fmt: skip
        if sdpo_wrapper == "entropy_opd":
            sdpo["h_max"] = entropy_opd_h_max
        pref: dict[str, Any] = {"type": dpo_variant, "weight": beta_replay, "rpo_alpha": replay_rpo_alpha}
        if dpo_variant == "simpo":
            pref.update(beta=simpo_beta, gamma=simpo_gamma)
        else:
            pref.update(beta=replay_dpo_beta)
        return cls(label_smoothing=lm_ce_label_smoothing, sdpo=sdpo, preference=pref)

    @field_validator("sdpo", mode="before")
    @classmethod
    def _sdpo_type(cls, v: Any) -> Any:
        return _legacy_sdpo(v)

    @field_validator("preference", mode="before")
    @classmethod
    def _preference_type(cls, v: Any) -> Any:
        return _legacy_preference(v)
