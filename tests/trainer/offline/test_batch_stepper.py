"""trainer.offline.batch_stepper: the offline trainer's step over caller-built batches (smoke, the Monarch recipe)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from composer_replication.batch import VARIANTS, build_batch
from composer_replication.config import ConfigError, build_config
from composer_replication.config.loss import RPO_ALPHA
from composer_replication.loss import compose_loss
from composer_replication.trainer.offline.batch_stepper import batch_config, batch_stepper


def test_two_steps_match_a_loop_written_out(tiny_model, tiny_tokenizer):
    batches = [build_batch(tiny_tokenizer, variant=v, seed=0, ref_model=tiny_model) for v in VARIANTS]
    ref = copy.deepcopy(tiny_model)
    cfg = batch_config(
        {
            "loss": {"sdpo": {"weight": 0.3}, "preference": {"type": "simpo", "weight": 0.2, "beta": 1.5}},
            "optimizer": {"lr": 1e-3, "weight_decay": 0.01, "grad_clip": 1.0},
            "schedule": {"max_steps": 2},
        }
    )
    stepper = batch_stepper(cfg, tiny_model, tiny_tokenizer, itertools.cycle(batches))
    rows = [stepper.step(), stepper.step()]

    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01, foreach=False)
    for row, batch in zip(rows, batches):  # the reference: compose_loss, backward, clip, AdamW, by hand
        out = compose_loss(
            ref,
            batch,
            alpha_sdpo=0.3,
            beta_replay=0.2,
            dpo_variant="simpo",
            simpo_beta=1.5,
            replay_rpo_alpha=RPO_ALPHA,
        )
        opt.zero_grad()
        out.total.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        opt.step()
        assert row["loss/total"] == pytest.approx(float(out.total), rel=1e-6)
        assert row["loss/trace_replay_dpo"] == pytest.approx(float(out.trace_replay_dpo), rel=1e-6)
    for a, b in zip(tiny_model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b)


def test_only_batch_callers_may_leave_out_the_data_files():
    assert batch_config({}).data.traces is None
    with pytest.raises(ConfigError, match="data.traces and/or data.pairs"):
        build_config({})
