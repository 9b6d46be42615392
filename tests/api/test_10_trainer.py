"""API reference §10, `composer_replication.trainer`, `.composer_trainer`, `.data_collator`: the trainer,
the PO presets and configs, the collator's types."""

from __future__ import annotations

import importlib

import pytest

from ._helpers import check_dataclass, check_same_object, check_signature, check_typeddict, sig_id

# §10 trainer
_CRT = "composer_replication.trainer.composer_trainer"
SIGNATURES: list[tuple[str, str, str, str]] = [
    (
        _CRT,
        "ComposerReplicationTrainer.__init__",
        """
        def __init__(
         self,
         *args: Any,
         alpha_sdpo: float = 0.1,
         beta_replay: float = 0.05,
         sdpo_jsd_beta: float = 0.5,
         sdpo_temperature: float = 1.0,
         sdpo_token_clip: float | None = None,
         replay_dpo_beta: float = 0.1,
         **kwargs: Any,
        ) -> None
        """,
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_loss",
        """
        def _compute_loss(
         self,
         model: torch.nn.Module,
         inputs: dict[str, torch.Tensor],
        ) -> torch.Tensor
        """,
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_sdpo_loss",
        "def _compute_sdpo_loss(self, model, inputs)",
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._compute_trace_replay_loss",
        "def _compute_trace_replay_loss(self, model, inputs)",
        "def",
    ),
    (
        _CRT,
        "ComposerReplicationTrainer._sequence_logprobs",
        "def _sequence_logprobs(model, input_ids, response_mask)",
        "static",
    ),
    ("composer_replication.trainer", "make_dr_grpo_config", "def make_dr_grpo_config(**overrides)", "def"),
    (
        "composer_replication.trainer",
        "make_po_config",
        'def make_po_config(objective="dr_grpo", **overrides)',
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "TokenizerLike.__call__",
        "def __call__(self, text: str | list[str], **kwargs: Any) -> dict[str, list]",
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "TokenizerLike.apply_chat_template",
        "def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> str | list[int]",
        "def",
    ),
    (
        "composer_replication.trainer.data_collator",
        "ComposerDataCollator.__call__",
        "def __call__(self, batch: Sequence[TraceExample]) -> dict[str, torch.Tensor]",
        "def",
    ),
]


@pytest.mark.parametrize("row", SIGNATURES, ids=sig_id)
def test_signature(row):
    check_signature(row)


DATACLASSES: list[tuple[str, str, str]] = [
    (
        "composer_replication.trainer.data_collator",
        "CollatorConfig",
        """
        @dataclass
        class CollatorConfig:
         max_seq_len: int = 4096
         max_dpo_seq_len: int = 2048
         pad_token_id: int = 0
         ignore_index: int = -100
         enable_sdpo: bool = True
         hint_generator: Callable[[str, dict], str | None] | None = None
         enable_replay_dpo: bool = True
         rlvr_reward_key: str = "final_reward"
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "ComposerDataCollator",
        """
        @dataclass
        class ComposerDataCollator:
         tokenizer: TokenizerLike
         config: CollatorConfig = field(default_factory=CollatorConfig)
        """,
    ),
]


@pytest.mark.parametrize("row", DATACLASSES, ids=lambda r: r[1])
def test_dataclass_fields(row):
    check_dataclass(row)


TYPEDDICTS: list[tuple[str, str, str]] = [
    (
        "composer_replication.trainer.data_collator",
        "TraceTurn",
        """
        class TraceTurn(TypedDict, total=False):
         role: str # "user" | "assistant" | "tool"
         content: str
         tool_call: dict | None
         tool_error: str | None
         error_meta: dict
        """,
    ),
    (
        "composer_replication.trainer.data_collator",
        "TraceExample",
        """
        class TraceExample(TypedDict, total=False):
         trace_id: str
         turns: list[TraceTurn]
         final_reward: float
         dpo_pairs: list[dict] | None
        """,
    ),
]


@pytest.mark.parametrize("row", TYPEDDICTS, ids=lambda r: r[1])
def test_typeddict_keys(row):
    check_typeddict(row)


SAME_OBJECT: list[tuple[str, str, str]] = [
    ("composer_replication.trainer", "ComposerReplicationTrainer", _CRT),
]


@pytest.mark.parametrize("row", SAME_OBJECT, ids=lambda r: f"{r[0]}.{r[1]}")
def test_same_object(row):
    check_same_object(row)


MODULES = [
    "composer_replication.trainer",
    "composer_replication.trainer.composer_trainer",
    "composer_replication.trainer.data_collator",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


# PO_OBJECTIVES table (§10): loss_type, scale_rewards, distinguishing knob(s).
PO_TABLE = {
    "grpo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "token"},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    "bnpo": {"loss_type": "bnpo", "scale_rewards": "batch"},
    "dapo": {
        "loss_type": "dapo",
        "scale_rewards": "none",
        "epsilon_high": 0.28,
        "mask_truncated_completions": True,
        "beta": 0.0,
    },
    "gspo": {"loss_type": "grpo", "scale_rewards": "group", "importance_sampling_level": "sequence"},
    "cispo": {"loss_type": "cispo", "scale_rewards": "none", "epsilon_high": 5.0},
}


@pytest.mark.parametrize("objective", sorted(PO_TABLE))
def test_po_objectives_presets(objective):
    from composer_replication.trainer import PO_OBJECTIVES

    assert objective in PO_OBJECTIVES, sorted(PO_OBJECTIVES)
    preset = PO_OBJECTIVES[objective]
    for key, value in PO_TABLE[objective].items():
        assert preset.get(key) == value, f"PO_OBJECTIVES[{objective!r}][{key!r}]: {preset.get(key)!r}"


@pytest.mark.parametrize("objective", sorted(PO_TABLE))
def test_make_po_config_builds_the_table(objective, tmp_path):
    pytest.importorskip("trl")
    from composer_replication.trainer import make_po_config

    cfg = make_po_config(objective, output_dir=str(tmp_path), report_to="none")
    for key, value in PO_TABLE[objective].items():
        assert getattr(cfg, key) == value, f"{objective}: GRPOConfig.{key} = {getattr(cfg, key)!r}"


def test_make_dr_grpo_config_forces_the_recipe(tmp_path):
    pytest.importorskip("trl")
    from composer_replication.trainer import make_dr_grpo_config

    cfg = make_dr_grpo_config(output_dir=str(tmp_path), learning_rate=1e-6, report_to="none")
    assert (cfg.loss_type, cfg.scale_rewards, cfg.num_iterations) == ("dr_grpo", "none", 1)
    assert cfg.learning_rate == 1e-6


def test_trainer_subclasses_grpo_trainer():
    trl = pytest.importorskip("trl")
    from composer_replication.trainer import ComposerReplicationTrainer

    assert issubclass(ComposerReplicationTrainer, trl.GRPOTrainer)


def test_make_po_config_unknown_objective_lists_menu():
    from composer_replication.trainer import PO_OBJECTIVES, make_po_config

    with pytest.raises(ValueError) as info:
        make_po_config("no_such_objective")
    for name in PO_OBJECTIVES:
        assert name in str(info.value)
