"""SimPO, DPO, TAID (+ scheduler), EOPD: float64 references written out here, TRL where TRL has the loss,
gradcheck, and the documented edge cases."""

from __future__ import annotations

import math
import types
from collections import defaultdict

import pytest
import torch

from composer_replication.distillation import (
    TAIDScheduler,
    avg_sequence_logprob,
    dpo_loss,
    entropy_aware_opd_loss,
    simpo_loss,
    taid_loss,
    teacher_entropy,
)
from composer_replication.loss import token_logprobs


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _close(a, b, rtol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(a).double(), torch.as_tensor(b).double(), rtol=rtol, atol=1e-12
    )


def log_sigmoid64(x):
    return -torch.log1p(torch.exp(-x.double()))


# ----------------------------------------------------------------------------- SimPO / DPO


@pytest.mark.parametrize("b", [1, 4, 9])
@pytest.mark.parametrize(("beta", "gamma", "eps"), [(2.0, 1.0, 0.0), (10.0, 0.5, 0.0), (2.5, 0.3, 0.1)])
def test_simpo_reference_and_trl_cpo(b, beta, gamma, eps):
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    g = _g(b)
    c, r = (
        -torch.rand(b, generator=g, dtype=torch.float64) * 3,
        -torch.rand(b, generator=g, dtype=torch.float64) * 3,
    )
    ours = simpo_loss(c, r, beta=beta, gamma=gamma, label_smoothing=eps)
    z = beta * (c - r) - gamma
    _close(ours, (-(1 - eps) * log_sigmoid64(z) - eps * log_sigmoid64(-z)).mean())
    # TRL's SimPO: CPOTrainer.cpo_loss(loss_type="simpo", simpo_gamma=γ, cpo_alpha irrelevant here)
    fake = types.SimpleNamespace(
        alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=eps,
        accelerator=types.SimpleNamespace(device=torch.device("cpu")),
    )  # fmt: skip
    losses, _, _ = cpo.CPOTrainer.cpo_loss(fake, c, r)
    _close(ours, losses.mean())


def test_avg_sequence_logprob_matches_trl_get_batch_logps():
    cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
    g = _g(3)
    logits = torch.randn(3, 7, 13, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 13, (3, 7), generator=g)
    labels[:, :2] = -100
    labels[1, 5:] = -100
    theirs = cpo.CPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
    lp = token_logprobs(logits[:, :-1], labels[:, 1:])
    _close(avg_sequence_logprob(lp, labels[:, 1:] != -100), theirs)
    _close(lp.sum(-1), cpo.CPOTrainer.get_batch_logps(logits, labels, average_log_prob=False))


def test_avg_sequence_logprob_edge_cases():
    lp = torch.tensor([[-1.0, -2.0, float("-inf")], [-3.0, -4.0, -5.0]])
    m = torch.tensor([[1, 1, 0], [0, 0, 0]])
    _close(avg_sequence_logprob(lp, m), torch.tensor([-1.5, 0.0]))
    with pytest.raises(ValueError, match="response_mask"):
        avg_sequence_logprob(lp, m[:, :2])


def _trl_dpo_sigmoid(policy_token_logps, completion_mask, ref_c, ref_r, beta):
    """Run TRL 1.16 DPOTrainer._compute_loss on given per-token log-probs (the model is a stand-in)."""
    from trl import DPOTrainer

    n = policy_token_logps.shape[0]

    def model(**_):
        zeros = torch.zeros_like(policy_token_logps)
        return types.SimpleNamespace(
            log_probs=policy_token_logps, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool()
        )

    model.training = True
    acc = types.SimpleNamespace(
        device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x
    )
    fake = types.SimpleNamespace(
        model=model, accelerator=acc, aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0], beta=beta,
        use_weighting=False, label_smoothing=0.0, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    inputs = {
        "input_ids": torch.zeros_like(completion_mask),
        "attention_mask": torch.ones_like(completion_mask),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_c,
        "ref_rejected_logps": ref_r,
    }
    assert n == 2 * ref_c.shape[0]
    return DPOTrainer._compute_loss(fake, model, inputs, False)


@pytest.mark.parametrize("b", [1, 3, 8])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_reference_and_trl(b, beta):
    pytest.importorskip("trl")
    g = _g(b + 100)
    t = 6
    mask = torch.ones(2 * b, t, dtype=torch.long)
    mask[:, :2] = 0
    tok = (torch.randn(2 * b, t - 1, generator=g, dtype=torch.float64) - 2) * mask[:, 1:]
    ref_c = -torch.rand(b, generator=g, dtype=torch.float64) * 10
    ref_r = -torch.rand(b, generator=g, dtype=torch.float64) * 10
    seq = tok.sum(1)
    ours = dpo_loss(seq[:b], seq[b:], ref_c, ref_r, beta=beta)
    delta = (seq[:b] - ref_c) - (seq[b:] - ref_r)
    _close(ours, (-log_sigmoid64(beta * delta)).mean())
    _close(ours, _trl_dpo_sigmoid(tok, mask, ref_c, ref_r, beta))


def test_chosen_nll_is_a_token_mean_over_the_batch():
    from composer_replication.losses.preference import chosen_nll, loss

    summed = torch.tensor([-6.0, -1.0], dtype=torch.float64)
    n = torch.tensor([3, 1])
    _close(chosen_nll(summed, n, average=False), 7.0 / 4)  # not the mean of per-pair means (1.5)
    _close(chosen_nll(summed / n, n, average=True), 7.0 / 4)
    _close(chosen_nll(summed, torch.tensor([0, 0]), average=False), 7.0)  # no token: count clamped to 1
    with pytest.raises(ValueError, match="chosen_tokens"):
        chosen_nll(summed, n[:1], average=False)
    ref = torch.tensor([-5.0, -2.0], dtype=torch.float64)
    rej = torch.tensor([-4.0, -3.0], dtype=torch.float64)
    plain, margin = loss(summed, rej, ref_chosen_logps=ref, ref_rejected_logps=ref)
    rpo, margin2 = loss(
        summed, rej, ref_chosen_logps=ref, ref_rejected_logps=ref, rpo_alpha=2.0, chosen_tokens=n
    )
    _close(rpo, plain + 2.0 * 7.0 / 4)
    _close(margin, margin2)
    with pytest.raises(ValueError, match="chosen_tokens"):
        loss(summed, rej, ref_chosen_logps=ref, ref_rejected_logps=ref, rpo_alpha=1.0)
    with pytest.raises(ValueError, match="rpo_alpha"):
        loss(summed, rej, ref_chosen_logps=ref, ref_rejected_logps=ref, rpo_alpha=-1.0, chosen_tokens=n)


def test_preference_losses_gradcheck_and_errors():
    g = _g(5)
    xs = [torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: dpo_loss(a, b, c, d, beta=0.3, label_smoothing=0.1), xs
    )
    assert torch.autograd.gradcheck(lambda a, b: simpo_loss(a, b, beta=2.0, gamma=1.0), xs[:2])
    empty = torch.zeros(0, requires_grad=True)
    out = simpo_loss(empty, empty.clone())
    out.backward()
    assert out == 0 and empty.grad is not None
    with pytest.raises(ValueError, match="chosen_avg_logprobs"):
        simpo_loss(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="same B"):
        dpo_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="floating-point"):
        dpo_loss(torch.zeros(3, dtype=torch.long), *[torch.zeros(3)] * 3)


# ----------------------------------------------------------------------------- TAID


def ref_taid(s, t, mask, tt):
    s, t = s.double(), t.double()
    p = torch.softmax((1 - tt) * s + tt * t, -1)
    per_token = -(p * torch.log_softmax(s, -1)).sum(-1)
    m = torch.ones(s.shape[:-1], dtype=torch.float64) if mask is None else mask.double()
    return (per_token * m).sum() / m.sum()


@pytest.mark.parametrize("shape", [(1, 1, 4), (2, 5, 11), (3, 2, 64)])
@pytest.mark.parametrize("tt", [0.0, 0.4, 1.0])
def test_taid_reference(shape, tt):
    g = _g(7)
    s, t = torch.randn(shape, generator=g) * 2, torch.randn(shape, generator=g) * 2
    mask = (torch.rand(shape[:-1], generator=g) > 0.3).long()
    mask.view(-1)[0] = 1
    _close(taid_loss(s.double(), t.double(), mask, t=tt), ref_taid(s, t, mask, tt))
    _close(taid_loss(s, t, mask, t=tt), ref_taid(s, t, mask, tt), rtol=1e-5)
    _close(taid_loss(s.double(), t.double(), t=torch.tensor(tt)), ref_taid(s, t, None, tt))


def test_taid_gradients():
    g = _g(8)
    s = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # the teacher leg is an ordinary differentiable function; at t = 1 the student anchor drops out
    assert torch.autograd.gradcheck(lambda b: taid_loss(s.detach(), b, mask, t=0.4), (t,))
    assert torch.autograd.gradcheck(lambda a, b: taid_loss(a, b, mask, t=1.0), (s, t))
    # the student gets the cross-entropy gradient of a *fixed* target: (softmax(z_S) - p_t) / N per token
    (grad,) = torch.autograd.grad(taid_loss(s, t.detach(), mask, t=0.4), s)
    p_t = torch.softmax(0.6 * s.detach() + 0.4 * t.detach(), -1)
    expected = (torch.softmax(s.detach(), -1) - p_t) * mask.unsqueeze(-1) / mask.sum()
    _close(grad, expected)


def test_taid_edge_cases_and_errors():
    s = torch.randn(2, 3, 5, requires_grad=True)
    out = taid_loss(s, torch.randn(2, 3, 5), torch.zeros(2, 3), t=0.5)
    out.backward()
    assert out == 0 and torch.all(s.grad == 0)
    z = torch.randn(1, 2, 5)
    z[..., 0] = float("-inf")  # a banned token in the student: zero-filled, as upstream
    assert torch.isfinite(taid_loss(z, torch.randn(1, 2, 5), t=0.5))
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="t="):
            taid_loss(s, s.detach(), t=bad)
    with pytest.raises(ValueError, match="same"):
        taid_loss(torch.randn(2, 3, 5), torch.randn(2, 3, 6), t=0.5)
    with pytest.raises(ValueError, match="mask"):
        taid_loss(torch.randn(2, 3, 5), torch.randn(2, 3, 5), torch.ones(2, 4), t=0.5)


def upstream_schedule(losses, n_steps, t_start=0.4, t_end=1.0, alpha=5e-4, beta=0.99):
    """SakanaAI/TAID TAID.update_t, written out (float64), skipping non-finite losses."""
    t, prev, m, out = t_start, math.inf, 0.0, []
    for step, loss in enumerate(losses):
        if not math.isfinite(loss):
            out.append((t, None))
            continue
        if math.isinf(prev):
            prev = loss
            out.append((t, None))
            continue
        m = beta * m + (1 - beta) * (prev - loss) / (prev + 1e-15)
        t_lin = t_start + (t_end - t_start) * step / n_steps
        delta = alpha * (1 / (1 + math.exp(-m))) * (1 - t)
        t = min(t_end, max(t_lin, t + delta))
        prev = loss
        out.append((t, delta))
    return out


def _scripted_losses(n):
    g = _g(11)
    base = torch.linspace(3.0, 1.0, n) + 0.2 * torch.randn(n, generator=g)
    losses = base.tolist()
    losses[0] = float("nan")  # a nan before the first finite loss is skipped, not used as the seed
    losses[7] = float("inf")
    return losses


def test_taid_scheduler_follows_upstream_rule():
    n = 60
    losses = _scripted_losses(n)
    sched = TAIDScheduler(num_train_steps=50, alpha=0.2)  # big alpha: the adaptive bump matters
    expected = upstream_schedule(losses, 50, alpha=0.2)
    ts = []
    for step, loss in enumerate(losses):
        delta = sched.update_t(torch.tensor(loss), global_step=step)
        t_ref, d_ref = expected[step]
        assert (delta is None) == (d_ref is None), step
        if delta is not None:
            _close(delta, d_ref, rtol=1e-6)
        _close(sched.t, t_ref, rtol=1e-12)
        ts.append(sched.t)
    assert ts[0] == ts[1] == 0.4  # nan skipped, first finite loss only seeds
    assert all(b >= a for a, b in zip(ts, ts[1:]))  # monotone
    assert max(ts) == 1.0 and all(t <= 1.0 for t in ts)  # capped at t_end
    assert any(t > 0.4 + 0.6 * s / 50 + 1e-3 for s, t in enumerate(ts))  # the adaptive rule lifted it
    lin = TAIDScheduler(num_train_steps=40, disable_adaptive=True, t_end=0.9)
    for step, loss in enumerate(losses):
        lin.update_t(loss, global_step=step)
        if step > 1 and math.isfinite(loss):
            _close(lin.t, min(0.9, 0.4 + 0.5 * step / 40))


def test_taid_scheduler_resume_gives_same_next_values():
    losses = _scripted_losses(30)
    a = TAIDScheduler(num_train_steps=30, alpha=0.05)
    for step, loss in enumerate(losses[:12]):
        a.update_t(loss, global_step=step)
    state = a.state_dict()
    b = TAIDScheduler(num_train_steps=999)  # config comes back from the state too
    b.load_state_dict(state)
    for step, loss in enumerate(losses[12:], start=12):
        da, db = a.update_t(loss, global_step=step), b.update_t(loss, global_step=step)
        assert a.t == b.t and (da is None) == (db is None)
        if da is not None:
            assert torch.equal(da, db)
    with pytest.raises(ValueError, match="state_dict"):
        b.load_state_dict({"t": 0.5})
    with pytest.raises(ValueError, match="num_train_steps"):
        TAIDScheduler(0)


# ----------------------------------------------------------------------------- EOPD


def ref_eopd(s, t, h_max, temperature=1.0):
    s, t = s.double() / temperature, t.double() / temperature
    ps, pt = torch.softmax(s, -1), torch.softmax(t, -1)
    ent = -(pt * pt.log()).sum(-1)
    w = (ent / h_max).clamp(0, 1)
    fwd = (pt * (pt.log() - ps.log())).sum(-1)
    rev = (ps * (ps.log() - pt.log())).sum(-1)
    return w * fwd + (1 - w) * rev


@pytest.mark.parametrize("shape", [(1, 1, 3), (2, 4, 10), (2, 3, 50)])
def test_eopd_reference_and_reductions(shape):
    g = _g(12)
    s, t = (
        torch.randn(shape, generator=g, dtype=torch.float64),
        torch.randn(shape, generator=g, dtype=torch.float64) * 2,
    )
    mask = (torch.rand(shape[:-1], generator=g) > 0.3).long()
    mask.view(-1)[0] = 1
    keep = mask.bool()
    for h_max, temp in ((None, 1.0), (1.0, 0.7)):
        d = ref_eopd(s, t, math.log(shape[-1]) if h_max is None else h_max, temp)
        kw = {"labels": mask, "h_max": h_max, "temperature": temp}
        _close(entropy_aware_opd_loss(s, t, **kw), d[keep].mean())
        _close(entropy_aware_opd_loss(s, t, reduction="sum", **kw), d[keep].sum())
        _close(entropy_aware_opd_loss(s, t, reduction="mean", **kw), d[keep].sum() / (keep.sum() * shape[-1]))
        _close(entropy_aware_opd_loss(s, t, reduction="none", **kw), d * keep)
    # HF-style labels (-100 = ignore) select the same tokens
    labels = torch.randint(2, 9, shape[:-1], generator=g).masked_fill(~keep, -100)
    _close(entropy_aware_opd_loss(s, t, labels=labels), entropy_aware_opd_loss(s, t, labels=mask))


def test_eopd_gate_endpoints_gradcheck_and_errors():
    g = _g(13)
    s = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: entropy_aware_opd_loss(a, b, h_max=1.3), (s, t))
    fwd = ((torch.softmax(t, -1) * (torch.log_softmax(t, -1) - torch.log_softmax(s, -1))).sum(-1)).mean()
    rev = ((torch.softmax(s, -1) * (torch.log_softmax(s, -1) - torch.log_softmax(t, -1))).sum(-1)).mean()
    _close(entropy_aware_opd_loss(s, t, h_max=1e-9), fwd)  # every token above h_max -> forward KL
    _close(entropy_aware_opd_loss(s, t, h_max=1e9), rev, rtol=1e-6)  # gate ~0 -> reverse KL
    h = teacher_entropy(t)
    _close(h, -(torch.softmax(t, -1) * torch.log_softmax(t, -1)).sum(-1))
    assert h.shape == (2, 3)
    big = torch.full((1, 1, 5), -1e4)
    big[..., 2] = 1e4
    assert teacher_entropy(big).item() == 0.0
    for kwargs, needle in (({"reduction": "avg"}, "reduction"), ({"h_max": 0.0}, "h_max"),
                           ({"labels": torch.ones(2, 4)}, "labels")):  # fmt: skip
        with pytest.raises(ValueError, match=needle):
            entropy_aware_opd_loss(s, t, **kwargs)
    with pytest.raises(ValueError, match="same"):
        entropy_aware_opd_loss(s, t[..., :5])
