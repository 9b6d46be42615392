"""Named policy-optimisation presets: each a set of real ``trl.GRPOConfig`` fields (plain data).

``trainer.grpo.objectives.make_po_config`` builds a ``GRPOConfig`` from them and guards that every knob
took effect; the config package checks ``grpo.objective`` against this menu without importing TRL.

Papers: GRPO (DeepSeekMath, arXiv 2402.03300); Dr. GRPO (arXiv 2503.20783; the Composer 2 report's base
objective, arXiv 2603.24477 §4.1); BNPO (TRL's batch-normalised aggregation); DAPO (arXiv 2503.14476);
GSPO (arXiv 2507.18071); CISPO (MiniMax-M1, arXiv 2506.13585).
"""

from __future__ import annotations

from typing import Any

# The distinguishing diagnostic that shows each preset's knob engaged (TRL metric names).
DIAGNOSTICS: dict[str, str] = {
    "grpo": "clip_ratio/region_mean",
    "dr_grpo": "clip_ratio/region_mean",
    "bnpo": "clip_ratio/region_mean",
    "dapo": "clip_ratio/high_mean",
    "gspo": "clip_ratio/region_mean",
    "cispo": "cispo_clip_ratio",
}

PO_OBJECTIVES: dict[str, dict[str, Any]] = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "token"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "num_iterations": 1},
    "bnpo": {"loss_type": "bnpo", "scale_rewards": "batch"},
    "dapo": {
        "loss_type": "dapo",
        "scale_rewards": "none",
        "epsilon": 0.2,
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "beta": 0.0,
    },
    "gspo": {
        "loss_type": "grpo",
        "scale_rewards": "group",
        "importance_sampling_level": "sequence",
        "epsilon": 3e-4,
        "epsilon_high": 4e-4,
    },
    "cispo": {"loss_type": "cispo", "scale_rewards": "none", "epsilon_high": 5.0},
}

# Loss types the installed TRL's ``_compute_loss`` dispatches on (checked by a contract test).
TRL_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
