"""One loss object from its config section: the library's flat signatures and the config give the same loss.

`ComposedLoss.from_config(cfg.loss)` is what every trainer calls; `compose_loss(...)` and
`ComposerReplicationTrainer(...)` are flat adapters that build the same config. Their defaults are the
config's (`config/loss.py`), and the total is summed in one function (`ComposedLoss.total`).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from composer_replication.batch import build_batch
from composer_replication.config.loss import LossConfig
from composer_replication.loss import ComposedLoss, compose_loss, sdpo_channel

SRC = Path(__file__).resolve().parents[2] / "src" / "composer_replication"


@pytest.fixture()
def batch_and_model(tiny_model, tiny_tokenizer):
    return tiny_model, build_batch(tiny_tokenizer, align_sdpo_shapes=True)


def _channels(comps) -> dict[str, float]:
    return comps.detached()


def test_library_defaults_are_the_config_defaults(batch_and_model) -> None:
    model, batch = batch_and_model
    torch.manual_seed(0)
    flat = compose_loss(model, batch)
    torch.manual_seed(0)
    obj = ComposedLoss.from_config(LossConfig())(model, batch)
    assert _channels(flat) == _channels(obj)
    assert flat.metrics == obj.metrics
    # every channel is on in this batch, so the defaults really were exercised
    assert all(v != 0 for v in _channels(obj).values())


def test_signature_defaults_equal_the_config_section() -> None:
    want = LossConfig().compose_loss_kwargs()
    params = inspect.signature(compose_loss).parameters
    for name, value in want.items():
        assert params[name].default == value, name
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer

    trainer_params = inspect.signature(ComposerReplicationTrainer.__init__).parameters
    for name, value in want.items():
        if name != "lm_ce_label_smoothing":  # GRPO has no CE channel
            assert trainer_params[name].default == value, name


@pytest.mark.parametrize(
    "section",
    [
        {},
        {
            "label_smoothing": 0.1,
            "sdpo": {"type": "taid", "weight": 2.0},
            "preference": {"type": "simpo", "beta": 3.0},
        },
        {
            "sdpo": {"type": "entropy_opd", "h_max": 2.5, "top_k": 8},
            "preference": {"rpo_alpha": 0.0, "beta": 0.2},
        },
    ],
)
def test_flat_arguments_round_trip(section: dict) -> None:
    cfg = LossConfig.model_validate(section)
    back = LossConfig.from_compose_loss_kwargs(**cfg.compose_loss_kwargs())
    assert back.compose_loss_kwargs() == cfg.compose_loss_kwargs()


def test_on_policy_rows_replace_the_recorded_ones(batch_and_model) -> None:
    """sdpo_inputs=None: no SDPO this micro-batch (the recorded keys are ignored); a batch: its rows."""
    model, batch = batch_and_model
    loss = ComposedLoss.from_config({"sdpo": {"weight": 1.0}})
    recorded = loss(model, batch)
    none = loss(model, batch, sdpo_inputs=None)
    assert float(none.sdpo_jsd.detach()) == 0.0 and float(recorded.sdpo_jsd.detach()) > 0
    assert torch.equal(none.total, none.lm_ce + loss.preference_weight * none.trace_replay_dpo)
    rows = {k: batch[k] for k in ("input_ids", "ctx_teacher_input_ids", "sdpo_loss_mask")}
    sampled = loss(model, batch, sdpo_inputs=rows)
    direct = sdpo_channel(model, rows["input_ids"], rows["ctx_teacher_input_ids"], rows["sdpo_loss_mask"])
    assert float(sampled.sdpo_jsd.detach()) == float(direct.loss.detach()) > 0
    assert float(sampled.lm_ce.detach()) == float(recorded.lm_ce.detach())


def test_the_total_is_summed_in_one_function() -> None:
    """No module adds a weighted SDPO or preference term outside ComposedLoss.total."""
    weighted = re.compile(
        r"(alpha_sdpo|sdpo_weight|sdpo\.weight|beta_replay|preference_weight|preference\.weight)\s*\*"
        r"|\*\s*(self\.)?(alpha_sdpo|sdpo_weight|beta_replay|preference_weight)\b"
    )
    hits = []
    for path in SRC.rglob("*.py"):
        if "datagen/tasks/" in str(path):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef):
                for line in ast.get_source_segment(path.read_text(encoding="utf-8"), node).splitlines():
                    if weighted.search(line) and not line.strip().startswith(("#", '"')):
                        hits.append((path.relative_to(SRC).as_posix(), node.name))
    assert sorted(set(hits)) == [("loss.py", "total")]
