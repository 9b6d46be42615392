"""`model.activation_checkpointing`: each decoder layer recomputed in backward, same training trajectory."""

from __future__ import annotations

import json

import torch

from composer_replication.config import build_config
from composer_replication.trainer.offline.loop import train_offline
from composer_replication.trainer.prepare import load_model

from ..conftest import tiny_config


def test_checkpointed_layers_train_the_same(small_data, tmp_path):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = tiny_config(small_data, schedule={"max_steps": 3, "batch_size": 2})
        on = tiny_config(
            small_data,
            schedule={"max_steps": 3, "batch_size": 2},
            model={"path": "tiny", "activation_checkpointing": True},
        )
        model, _ = load_model(build_config(on), torch.device("cpu"))
        assert model.is_gradient_checkpointing
        assert not load_model(build_config(cfg), torch.device("cpu"))[0].is_gradient_checkpointing
        train_offline(cfg, out_dir=tmp_path / "off")
        train_offline(on, out_dir=tmp_path / "on")
    finally:
        torch.set_num_threads(n)
    rows = lambda d: [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    got, want = rows("on"), rows("off")
    assert len(got) == 3
    for a, b in zip(got, want):
        for key in ("loss/total", "loss/lm_ce", "loss/trace_replay_dpo", "grad_norm"):
            assert abs(a[key] - b[key]) <= 1e-6 * abs(b[key]), key
