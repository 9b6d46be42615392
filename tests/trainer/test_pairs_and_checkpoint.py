"""Pair tokenisation (both row shapes) and atomic checkpoints."""

from __future__ import annotations

import os

import torch

from composer_replication.trainer import checkpoint as ckpt
from composer_replication.trainer import pair_tokens


def test_both_pair_shapes_encode_identically(tiny_tokenizer):
    msgs = [{"role": "user", "content": "read setup.py"}]
    dpo = {
        "state_id": "s::1",
        "state_messages": msgs,
        "chosen": "A",
        "rejected": "B",
        "n_teachers_agreeing": 2,
    }
    norm = {
        "state_id": "s::1", "state_messages": msgs, "n_teachers_agreeing": 2, "metadata": {},
        "chosen_messages": [{"role": "assistant", "content": "A"}],
        "rejected_messages": [{"role": "assistant", "content": "B"}],
    }  # fmt: skip
    a, b = pair_tokens.encode_pairs(tiny_tokenizer, [dpo]), pair_tokens.encode_pairs(tiny_tokenizer, [norm])
    for key in ("dpo_chosen_input_ids", "dpo_rejected_input_ids", "dpo_chosen_response_mask"):
        assert torch.equal(a[key], b[key])
    assert a["pair_ids"] == b["pair_ids"]
    ids, mask = a["dpo_chosen_input_ids"][0], a["dpo_chosen_response_mask"][0]
    resp = tiny_tokenizer.decode(ids[mask.bool()])
    assert resp == "A" + tiny_tokenizer.eos_token
    prompt = tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert tiny_tokenizer.decode(ids[~mask.bool()]) == prompt


def test_long_prompts_are_cut_from_the_left(tiny_tokenizer):
    msgs = [{"role": "user", "content": "x " * 400}]
    pair = {"state_id": "s", "state_messages": msgs, "chosen": "yes", "rejected": "no"}
    enc = pair_tokens.encode_pairs(tiny_tokenizer, [pair], max_len=32)
    assert enc["dpo_chosen_input_ids"].shape[1] <= 32
    assert tiny_tokenizer.decode(
        enc["dpo_chosen_input_ids"][0][enc["dpo_chosen_response_mask"][0].bool()]
    ).startswith("yes")


def test_checkpoint_atomic_keep_last_and_stale_tmp(tmp_path):
    root = tmp_path / "ck"
    (root / ".tmp-step-00000009-1").mkdir(parents=True)  # a save killed half-way
    (root / "step-00000007").mkdir()  # a directory without state.pt is not a checkpoint
    for step in (1, 2, 3):
        ckpt.save_checkpoint(root, step, {"step": step, "w": torch.full((2,), float(step))}, keep_last=2)
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step-00000002", "step-00000003", "step-00000007"]
    latest = ckpt.latest_checkpoint(root)
    assert latest.name == "step-00000003"
    assert torch.equal(ckpt.load_checkpoint(latest)["w"], torch.full((2,), 3.0))
    assert not any(n.startswith(".tmp") for n in os.listdir(root))


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = ckpt.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_pairs_survive_a_mixed_arrow_column():
    """A datasets column holding both shapes fills the absent keys with None; both must still parse."""
    datasets = __import__("pytest").importorskip("datasets")
    dpo = {
        "state_id": "a",
        "state_messages": [{"role": "user", "content": "q"}],
        "chosen": "C",
        "rejected": "R",
    }
    norm = {
        "state_id": "b", "state_messages": [{"role": "user", "content": "q"}],
        "chosen_messages": [{"role": "assistant", "content": "C2"}],
        "rejected_messages": [{"role": "assistant", "content": "R2"}],
    }  # fmt: skip
    col = [row["p"] for row in datasets.Dataset.from_list([{"p": dpo}, {"p": norm}])]
    assert [pair_tokens.pair_fields(p)[2:] for p in col] == [("C", "R"), ("C2", "R2")]
