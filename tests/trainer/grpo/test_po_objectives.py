"""PO presets over the installed TRL's GRPOConfig, the drift guard, and the TRL contract."""

from __future__ import annotations

import inspect

import pytest

trl = pytest.importorskip("trl")

from composer_replication.trainer import (  # noqa: E402
    PO_OBJECTIVES,
    make_dr_grpo_config,
    make_po_config,
)
from composer_replication.trainer.grpo import objectives as po_objectives  # noqa: E402

KNOBS = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "token"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "num_iterations": 1},
    "bnpo": {"loss_type": "bnpo", "scale_rewards": "batch"},
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28, "mask_truncated_completions": True, "beta": 0.0},
    "gspo": {"importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
}


def test_menu_is_the_documented_one():
    assert set(PO_OBJECTIVES) == set(KNOBS)


@pytest.mark.parametrize("objective", sorted(KNOBS))
def test_each_preset_sets_its_knob(objective, tmp_path):
    cfg = make_po_config(objective, output_dir=str(tmp_path), report_to="none")
    assert isinstance(cfg, trl.GRPOConfig)
    for key, value in KNOBS[objective].items():
        assert getattr(cfg, key) == value, key


def test_dr_grpo_helper_and_overrides(tmp_path):
    cfg = make_dr_grpo_config(output_dir=str(tmp_path), learning_rate=2e-6, beta=0.04)
    assert (cfg.loss_type, cfg.scale_rewards, cfg.num_iterations) == ("dr_grpo", "none", 1)
    assert cfg.learning_rate == 2e-6 and cfg.beta == 0.04
    cfg = make_po_config("dapo", output_dir=str(tmp_path), epsilon_high=0.35)
    assert cfg.epsilon_high == 0.35


def test_unknown_objective_lists_the_menu():
    with pytest.raises(ValueError) as err:
        make_po_config("ppo")
    for name in PO_OBJECTIVES:
        assert name in str(err.value)


def test_unknown_field_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="epsilon_hi"):
        make_po_config("dapo", output_dir=str(tmp_path), epsilon_hi=0.3)


def test_drift_guard_fires_when_a_knob_silently_fails(monkeypatch, tmp_path):
    class DriftedConfig(trl.GRPOConfig):
        def __post_init__(self):
            super().__post_init__()
            self.importance_sampling_level = "token"  # a TRL upgrade that ignores the GSPO knob

    monkeypatch.setattr(po_objectives, "_grpo_config_cls", lambda: DriftedConfig)
    with pytest.raises(AssertionError, match="importance_sampling_level"):
        make_po_config("gspo", output_dir=str(tmp_path))


def test_trl_contract_compute_loss_hook_and_loss_types():
    """Fails loudly if TRL changes the hook we override or the loss types the presets rely on."""
    assert trl.__version__ == "1.16.0", "the trainer is pinned to trl==1.16.0; re-check algorithms.md §6.4"
    sig = inspect.signature(trl.GRPOTrainer._compute_loss)
    assert list(sig.parameters) == ["self", "model", "inputs"]
    src = inspect.getsource(trl.GRPOTrainer._compute_loss)
    for loss_type in po_objectives.TRL_LOSS_TYPES:
        assert f'"{loss_type}"' in src, loss_type
    for key in (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
    ):
        assert f'inputs["{key}"]' in src or f'"{key}"' in inspect.getsource(
            trl.GRPOTrainer._generate_and_score_completions
        ), key
    fields = set(trl.GRPOConfig.__dataclass_fields__)
    for knobs in PO_OBJECTIVES.values():
        assert set(knobs) <= fields
