"""Named policy-optimisation presets over TRL 1.16's ``GRPOConfig`` (no custom loss code).

Each preset is a set of real ``GRPOConfig`` fields; ``make_po_config`` builds the config, applies the
user's overrides on top, and then checks (the drift guard) that every knob the preset or the user asked
for is what the built config actually holds: a field renamed or normalised away by a TRL upgrade fails
loudly with ``AssertionError`` instead of silently training a different objective.

Papers: GRPO (DeepSeekMath, arXiv 2402.03300); Dr. GRPO (arXiv 2503.20783; the Composer 2 report's base
objective, arXiv 2603.24477 §4.1); BNPO (TRL's batch-normalised aggregation); DAPO (arXiv 2503.14476);
GSPO (arXiv 2507.18071); CISPO (MiniMax-M1, arXiv 2506.13585).

KL. TRL adds ``beta * k3`` to the loss (``exp(ref - logp) - (ref - logp) - 1``). The Composer report uses
k1 = ``-log r`` and argues against k3; k1 as a differentiable loss term has zero expected gradient, so
the faithful reading puts it in the reward. ``composer_kl_coef`` (on ``ComposerReplicationTrainer``)
does exactly that; see docs/training.md. TRL is not monkeypatched.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import require
from composer_replication.config.presets import DIAGNOSTICS, PO_OBJECTIVES, TRL_LOSS_TYPES

__all__ = ["DIAGNOSTICS", "PO_OBJECTIVES", "TRL_LOSS_TYPES", "make_dr_grpo_config", "make_po_config"]

# GRPOConfig normalises some values in __post_init__; compare in normal form.
_NORMALISE = {"scale_rewards": {True: "group", False: "none"}}


def _grpo_config_cls():
    require("trl", "trl", purpose="make_po_config")
    from trl import GRPOConfig

    return GRPOConfig


def make_po_config(objective: str = "dr_grpo", **overrides: Any):
    """Build a ``trl.GRPOConfig`` for a named objective from ``PO_OBJECTIVES``, overrides on top.

    Raises ``ValueError`` for an unknown objective (the message lists the menu) or an unknown
    ``GRPOConfig`` field, and ``AssertionError`` if a requested knob did not take effect.
    """
    if objective not in PO_OBJECTIVES:
        raise ValueError(
            f"unknown PO objective {objective!r}; choose one of: {', '.join(sorted(PO_OBJECTIVES))}"
        )
    cls = _grpo_config_cls()
    fields = set(cls.__dataclass_fields__)
    wanted = {**PO_OBJECTIVES[objective], **overrides}
    unknown = sorted(set(wanted) - fields)
    if unknown:
        raise ValueError(
            f"GRPOConfig (trl) has no field(s) {unknown} (objective {objective!r}); check the spelling "
            "against trl.GRPOConfig"
        )
    if wanted.get("loss_type") not in TRL_LOSS_TYPES:
        raise ValueError(f"loss_type {wanted.get('loss_type')!r} is not one of TRL's {TRL_LOSS_TYPES}")
    wanted.setdefault("output_dir", "runs/grpo")
    # TRL defaults to bf16=True, which transformers rejects on machines without bf16 support (any CPU
    # run); default to what the hardware has, so the same call works on a laptop and on an H100.
    import torch

    wanted.setdefault("bf16", bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()))
    config = cls(**wanted)
    # Guard the preset's knobs (with the user's value where overridden). Other fields pass through:
    # TRL legitimately normalises some of them (``report_to="none"`` becomes ``[]``).
    for key in PO_OBJECTIVES[objective]:
        value = wanted[key]
        expected = _NORMALISE[key].get(value, value) if key in _NORMALISE else value
        actual = getattr(config, key)
        assert actual == expected, (
            f"drift guard: GRPOConfig.{key} is {actual!r} after construction, but {objective!r} asked for "
            f"{expected!r}; the installed TRL changed this knob"
        )
    return config


def make_dr_grpo_config(**overrides: Any):
    """``make_po_config("dr_grpo", **overrides)``: loss_type=dr_grpo, scale_rewards=none, num_iterations=1."""
    return make_po_config("dr_grpo", **overrides)
