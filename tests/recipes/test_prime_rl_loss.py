"""The prime-rl custom loss gives the same values and gradients as compose_loss's channels on the same tensors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from composer_replication.loss import preference_channel, sdpo_channel, sequence_logprobs, token_logprobs
from composer_replication.models import build_tiny_model
from composer_replication.recipes.prime_rl import composer_loss as pl


def _grads(model):
    return [
        p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()
    ]


def _seq(prompt, resp):
    ids = torch.tensor(prompt + resp)
    mask = torch.tensor([0] * len(prompt) + [1] * len(resp))
    return ids, mask


def test_sdpo_matches_sdpo_channel(tiny_tokenizer):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer=tiny_tokenizer, seed=0)
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(2):
        prompt, hint, resp = (torch.randint(5, 2000, (n,), generator=g).tolist() for n in (4, 3, 5))
        s_ids, s_mask = _seq(prompt, resp)
        t_ids, t_mask = _seq(prompt + hint, resp)
        rows.append((s_ids, s_mask, t_ids, t_mask))
    # Pad students to a common length on the right (same lengths here), teachers likewise.
    input_ids = torch.stack([r[0] for r in rows])
    response_mask = torch.stack([r[1] for r in rows])
    ctx = torch.stack([r[2] for r in rows])
    sdpo_mask = torch.stack([r[3] for r in rows])

    ref = sdpo_channel(model, input_ids, ctx, sdpo_mask, response_mask=response_mask, jsd_beta=0.5)
    ref.loss.backward()
    ref_grads = _grads(model)
    model.zero_grad()

    # prime-rl path: per-sequence sums of the custom loss, divided by the global token count.
    s_logits = model(input_ids=input_ids).logits
    with torch.no_grad():
        t_logits = model(input_ids=ctx).logits
    total, n = 0.0, 0
    for b in range(2):
        s_rows = s_logits[b, :-1][response_mask[b, 1:].bool()]
        t_rows = t_logits[b, :-1][sdpo_mask[b, 1:].bool()]
        labels = input_ids[b, 1:][response_mask[b, 1:].bool()]
        lp = token_logprobs(s_rows.unsqueeze(0), labels.unsqueeze(0))[0]
        inp = pl.LossInputs(
            trainer_logprobs=lp,
            inference_logprobs=lp.detach(),
            advantages=torch.zeros_like(lp),
            loss_mask=torch.ones_like(lp, dtype=torch.bool),
            logits=s_rows,
            teacher_logits=t_rows,
        )
        total = total + pl.sdpo_loss(inp, jsd_beta=0.5).loss
        n += len(lp)
    mine = total / n
    mine.backward()
    assert n == ref.count == 10
    torch.testing.assert_close(mine.detach(), ref.loss.detach(), rtol=1e-6, atol=1e-7)
    for a, b in zip(_grads(model), ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_dpo_matches_preference_channel(tiny_tokenizer):
    # float64: both sides sum the same terms in a different order; in fp32 that alone moves a gradient
    # entry by ~1e-8 absolute on some CPUs, which would hide nothing but fail the tolerance.
    policy = build_tiny_model(tokenizer=tiny_tokenizer, seed=0).double()
    reference = build_tiny_model(tokenizer=tiny_tokenizer, seed=1).double()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(5, 2000, (2, 4), generator=g)
    chosen = torch.cat([prompt, torch.randint(5, 2000, (2, 5), generator=g)], 1)
    rejected = torch.cat([prompt, torch.randint(5, 2000, (2, 5), generator=g)], 1)
    mask = torch.tensor([[0] * 4 + [1] * 5] * 2)
    with torch.no_grad():
        ref_c = sequence_logprobs(reference, chosen, mask)
        ref_r = sequence_logprobs(reference, rejected, mask)
    ref = preference_channel(
        policy,
        chosen,
        mask,
        rejected,
        mask,
        variant="dpo",
        ref_chosen_logps=ref_c,
        ref_rejected_logps=ref_r,
        beta=0.1,
        rpo_alpha=0.0,  # plain DPO, as prime-rl's dpo_loss
    )
    ref.loss.backward()
    ref_grads = _grads(policy)
    policy.zero_grad()

    def tok_lp(model, ids):
        return token_logprobs(
            model(input_ids=ids).logits[:, :-1], ids[:, 1:].masked_fill(~mask[:, 1:].bool(), -100)
        )

    lp_c, lp_r = tok_lp(policy, chosen), tok_lp(policy, rejected)
    with torch.no_grad():
        rl_c, rl_r = tok_lp(reference, chosen), tok_lp(reference, rejected)
    keep = mask[:, 1:].bool()
    losses = []
    for b in range(2):
        trainer = torch.cat([lp_c[b][keep[b]], lp_r[b][keep[b]]])
        refs = torch.cat([rl_c[b][keep[b]], rl_r[b][keep[b]]])
        adv = torch.cat([torch.ones(int(keep[b].sum())), -torch.ones(int(keep[b].sum()))])
        inp = pl.LossInputs(
            trainer, trainer.detach(), adv, torch.ones_like(adv, dtype=torch.bool), ref_logprobs=refs
        )
        losses.append(pl.dpo_loss(inp, beta=0.1).loss)
    mine = torch.stack(losses).mean()
    mine.backward()
    torch.testing.assert_close(mine.detach(), ref.loss.detach(), rtol=1e-6, atol=1e-7)
    for a, b in zip(_grads(policy), ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_policy_term_against_float64_reference():
    lp = torch.tensor([-1.0, -0.5, -2.0, -0.1], dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([-1.1, -1.5, -2.0, -0.1], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    mask = torch.tensor([True, True, True, False])
    out = pl.composer_loss(pl.LossInputs(lp, mu, adv, mask), alpha_sdpo=0.0)
    # Written out: token 1 has p_train - p_infer = e^-0.5 - e^-1.5 = 0.383 > 0.2 with A > 0 -> masked.
    import math

    r0 = math.exp(-1.0 + 1.1)
    expected = (-1.0 * r0 + 1e-3 * 0.1**2) + (0 + 1e-3 * 1.0**2) + (1.0 * 1.0 + 0.0)
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    assert int(out.metrics["policy/masked"]) == 1
    out.loss.backward()
    assert lp.grad[3] == 0 and lp.grad[1].item() == pytest.approx(2e-3 * 1.0, rel=1e-12)


def test_sampled_reverse_kl_gradient_and_errors():
    lp = torch.tensor([-1.0, -2.0], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([-1.5, -1.0], dtype=torch.float64)
    inp = pl.LossInputs(lp, lp.detach(), torch.zeros(2), torch.tensor([True, True]), ref_logprobs=q)
    pl.sdpo_loss(inp).loss.backward()
    torch.testing.assert_close(lp.grad, (lp.detach() - q))
    with pytest.raises(ValueError, match="hinted teacher"):
        pl.sdpo_loss(pl.LossInputs(lp, lp, torch.zeros(2), torch.tensor([True, True])))
    with pytest.raises(ValueError, match="advantage \\+1"):
        pl.dpo_loss(pl.LossInputs(lp, lp, torch.ones(2), torch.tensor([True, True]), ref_logprobs=q))


def test_example_toml_points_at_real_functions():
    import importlib

    cfg = tomllib.loads((Path(pl.__file__).parent / "example.toml").read_text())
    module, _, name = cfg["trainer"]["loss"]["import_path"].rpartition(".")
    fn = getattr(importlib.import_module(module), name)
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = fn(
        pl.LossInputs(lp, lp.detach(), torch.ones(2), torch.tensor([True, True])),
        **cfg["trainer"]["loss"]["kwargs"],
    )
    assert out.loss.shape == () and out.loss.requires_grad
