"""ComposerReplicationTrainer on a tiny model on CPU: all three channels, equality with plain GRPO at
alpha = beta = 0, the PO presets' diagnostics, online hints and the k1-in-reward KL."""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402

from composer_replication.models import build_tiny_model  # noqa: E402
from composer_replication.trainer import ComposerReplicationTrainer, make_po_config  # noqa: E402

PAIR = {
    "state_id": "t1::0",
    "state_messages": [{"role": "user", "content": "list the files"}],
    "chosen": '[TOOL_USE] name=Bash input={"command": "ls"}',
    "rejected": "I cannot do that.",
    "n_teachers_agreeing": 2,
}
NORMALIZED = {
    "state_id": "t2::3",
    "state_messages": [{"role": "user", "content": "read setup.py"}],
    "chosen_messages": [
        {"role": "assistant", "content": '[TOOL_USE] name=Read input={"file_path": "setup.py"}'}
    ],
    "rejected_messages": [{"role": "assistant", "content": "Done."}],
    "n_teachers_agreeing": 3,
    "metadata": {},
}


def reward_len(completions, **_):
    return [float(len(c[0]["content"]) % 5) for c in completions]


@pytest.fixture()
def tok(tiny_tokenizer):
    tiny_tokenizer.padding_side = "left"
    return tiny_tokenizer


def rows(n=2, **extra):
    base = [{"prompt": [{"role": "user", "content": f"task {i}: list the files"}]} for i in range(n)]
    return Dataset.from_list([{**r, **{k: (v[i] if isinstance(v, list) else v) for k, v in extra.items()}}
                              for i, r in enumerate(base)])  # fmt: skip


def args(tmp_path, objective="dr_grpo", **kw):
    base = dict(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, max_steps=1, logging_steps=1, learning_rate=1e-3, seed=0,
        disable_tqdm=True,
    )  # fmt: skip
    base.update(kw)
    return make_po_config(objective, **base)


def run(cls, tok, tmp_path, dataset, objective="dr_grpo", trainer_kw=None, **kw):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer=tok, seed=0)
    t = cls(model=model, reward_funcs=reward_len, args=args(tmp_path, objective, **kw), train_dataset=dataset,
            processing_class=tok, **(trainer_kw or {}))  # fmt: skip
    t.train()
    return t, model


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_three_channels_fire(tok, tmp_path):
    seen = {}

    class Spy(ComposerReplicationTrainer):
        def _compute_loss(self, model, inputs):
            seen.update({k: tuple(v.shape) if torch.is_tensor(v) else v for k, v in inputs.items()})
            return super()._compute_loss(model, inputs)

    ds = rows(2, hint="use the Bash tool with ls", dpo_pair=[PAIR, NORMALIZED])
    t, _ = run(Spy, tok, tmp_path, ds, trainer_kw=dict(alpha_sdpo=0.5, beta_replay=0.5))
    assert logged(t, "sdpo/loss")[0] > 0 and logged(t, "sdpo/tokens")[0] > 0
    # one prompt (x4 generations) per step: its pair counts once, not once per generation
    assert logged(t, "pref/loss")[0] > 0 and logged(t, "pref/pairs")[0] == 1
    assert logged(t, "loss")[0] != 0
    # TRL's keys reach _compute_loss unchanged, plus ours (the contract the subclass relies on)
    trl_keys = {
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "advantages",
        "num_items_in_batch",
    }
    assert trl_keys <= set(seen)
    assert {"sdpo_prompt_ids", "sdpo_loss_mask", "dpo_chosen_input_ids", "dpo_chosen_ref_logprobs"} <= set(
        seen
    )
    assert len(t._ref_logps_cache) == 1  # one reference pass per pair id


def test_alpha_beta_zero_equals_plain_grpo(tok, tmp_path):
    ds = rows(2, hint="use ls", dpo_pair=[PAIR, PAIR])
    ours, m1 = run(
        ComposerReplicationTrainer, tok, tmp_path / "a", ds, trainer_kw=dict(alpha_sdpo=0.0, beta_replay=0.0)
    )
    plain, m2 = run(trl.GRPOTrainer, tok, tmp_path / "b", ds)
    assert logged(ours, "loss") == logged(plain, "loss")
    for (n, p), (_, q) in zip(m1.named_parameters(), m2.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize(
    "objective, diagnostic",
    [
        ("dapo", "clip_ratio/high_mean"),
        pytest.param("cispo", "cispo_clip_ratio", marks=pytest.mark.slow),
        pytest.param("gspo", "clip_ratio/region_mean", marks=pytest.mark.slow),
    ],
)
def test_preset_diagnostic_engages(tok, tmp_path, objective, diagnostic):
    """Two PPO epochs per generation at a large LR move the ratio past the preset's clip, so the
    distinguishing diagnostic is > 0 (a 0 would mean the knob never engaged)."""
    extra = {"mask_truncated_completions": False} if objective == "dapo" else {}  # random model: no EOS
    if objective == "cispo":
        extra["epsilon_high"] = 1.05
    t, _ = run(ComposerReplicationTrainer, tok, tmp_path, rows(1), objective, num_iterations=2, learning_rate=0.05,
               max_steps=2, per_device_train_batch_size=4, trainer_kw=dict(alpha_sdpo=0.0, beta_replay=0.0), **extra)  # fmt: skip
    assert max(logged(t, diagnostic)) > 0


def test_online_hint_from_a_failed_tool_call(tok, tmp_path):
    t = ComposerReplicationTrainer(model=build_tiny_model(tokenizer=tok), reward_funcs=reward_len,
                                   args=args(tmp_path), train_dataset=rows(1), processing_class=tok)  # fmt: skip
    t.tools = [lambda: None]  # what TRL sets when tools are passed; only the hint path is exercised here
    failed = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]},
              {"role": "tool", "name": "read_file", "content": "{'error': 'Tool read_file not found.'}"}]  # fmt: skip
    ok = [{"role": "assistant", "content": "done"}]
    t._logs["completion"].extend([failed, ok])
    hints = t._row_hints([{"prompt": "a"}, {"prompt": "b"}])
    assert hints[0] and hints[1] is None
    prompt = t._prompt_with_hint([{"role": "user", "content": "fix it"}], hints[0])
    assert prompt[-1]["content"].startswith("fix it\n\n[HINT] ")


def test_k1_kl_in_reward_shifts_advantages(tok, tmp_path):
    t, _ = run(ComposerReplicationTrainer, tok, tmp_path, rows(1), max_steps=2,
               trainer_kw=dict(alpha_sdpo=0.0, beta_replay=0.0, composer_kl_coef=0.5))  # fmt: skip
    k1 = logged(t, "kl_k1/mean")
    assert k1[0] == pytest.approx(0.0, abs=1e-6)  # policy == reference before the first update
    assert abs(k1[1]) > 0  # after an update, k1 = sum(log pi - log pi_ref) is nonzero


def test_channel_scaling_is_invariant_to_gradient_accumulation(tok, tmp_path):
    """The SDPO channel is scaled the way TRL scales its own loss: one step of 4 completions as one
    micro-batch (GA = 1) or as two micro-batches of 2 (GA = 2) moves the weights by the same channel
    gradient. Plain SGD without clipping, so a weight update is -lr x gradient and the channel's part is
    the difference from plain GRPOTrainer on the same seed."""
    ds = rows(1, hint="use the Bash tool with ls")
    kw = dict(optim="sgd", max_grad_norm=0.0, learning_rate=1e-2, max_steps=1)
    deltas = []
    for bs, ga in ((4, 1), (2, 2)):
        common = dict(per_device_train_batch_size=bs, gradient_accumulation_steps=ga, **kw)
        ours, m1 = run(ComposerReplicationTrainer, tok, tmp_path / f"o{ga}", ds,
                       trainer_kw=dict(alpha_sdpo=1.0, beta_replay=0.0), **common)  # fmt: skip
        assert logged(ours, "sdpo/tokens")[0] > 0
        plain, m2 = run(trl.GRPOTrainer, tok, tmp_path / f"p{ga}", ds, **common)
        deltas.append(torch.cat([(p - q).flatten() for p, q in zip(m1.parameters(), m2.parameters())]))
    a, b = deltas
    assert a.abs().max() > 1e-6  # the channel moved the weights
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
