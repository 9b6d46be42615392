"""generalized_jsd_loss against a float64 reference written out here, against TRL's GKD and SDPO code,
and for the documented behaviour of every option."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from composer_replication.opsd import generalized_jsd_loss, gjsd_per_token

SHAPES = [(1, 1, 3), (2, 5, 11), (3, 4, 64)]
BETAS = [0.0, 0.1, 0.5, 0.9, 1.0]


def ref_per_token(s, t, beta, temperature=1.0, top_k=None):
    """Float64, probability space, straight from the definition; (..., V) -> (...)."""
    s, t = s.double() / temperature, t.double() / temperature
    ps, pt = torch.softmax(s, -1), torch.softmax(t, -1)
    if top_k is not None:
        idx = pt.topk(top_k, -1).indices
        ps, pt = ps.gather(-1, idx), pt.gather(-1, idx)
        ps, pt = ps / ps.sum(-1, keepdim=True), pt / pt.sum(-1, keepdim=True)

    def kl(p, q):
        return (p * (p.log() - q.log())).sum(-1)

    if beta == 0:
        return kl(pt, ps)
    if beta == 1:
        return kl(ps, pt)
    m = (1 - beta) * ps + beta * pt
    return beta * kl(pt, m) + (1 - beta) * kl(ps, m)


def _inputs(shape, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    t = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    labels = torch.randint(0, shape[-1], shape[:-1], generator=g)
    drop = torch.rand(shape[:-1], generator=g) < 0.3
    drop.view(-1)[0] = False  # keep at least one token
    return s, t, labels.masked_fill(drop, -100)


def _rel_close(a, b, rtol=1e-6):
    torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", BETAS)
def test_matches_float64_reference_all_reductions(shape, beta):
    s, t, labels = _inputs(shape)
    d = ref_per_token(s, t, beta)
    keep = labels != -100
    n, v = int(keep.sum()), shape[-1]
    _rel_close(generalized_jsd_loss(s, t, labels, beta=beta), d[keep].sum() / n)
    _rel_close(generalized_jsd_loss(s, t, labels, beta=beta, reduction="sum"), d[keep].sum())
    _rel_close(generalized_jsd_loss(s, t, labels, beta=beta, reduction="mean"), d[keep].sum() / (n * v))
    _rel_close(generalized_jsd_loss(s, t, labels, beta=beta, reduction="none"), d * keep)
    _rel_close(generalized_jsd_loss(s, t, beta=beta), d.mean())  # no labels: mean per token


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", BETAS)
def test_matches_trl_gkd(shape, beta):
    gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
    trl_jsd = gkd.GKDTrainer.generalized_jsd_loss
    for dtype in (torch.float64, torch.float32):
        s, t, labels = (x.to(dtype) if x.is_floating_point() else x for x in _inputs(shape, seed=1))
        for temperature in (1.0, 0.7):
            for reduction in ("batchmean", "sum", "mean"):
                ours = generalized_jsd_loss(
                    s, t, labels, beta=beta, temperature=temperature, reduction=reduction
                )
                theirs = trl_jsd(s, t, labels, beta=beta, temperature=temperature, reduction=reduction)
                _rel_close(ours, theirs, rtol=1e-6 if dtype == torch.float64 else 1e-5)
            # TRL's "none" is element-wise over the kept rows: sum its V axis to compare per token.
            ours = generalized_jsd_loss(s, t, labels, beta=beta, temperature=temperature, reduction="none")
            theirs = trl_jsd(s, t, labels, beta=beta, temperature=temperature, reduction="none").sum(-1)
            _rel_close(ours[labels != -100], theirs, rtol=1e-6 if dtype == torch.float64 else 1e-5)
    # Without labels TRL's "batchmean" divides by B; ours is the mean per token (documented difference).
    s, t, _ = _inputs(shape, seed=2)
    b, tt = shape[0], shape[1]
    _rel_close(generalized_jsd_loss(s, t, beta=beta) * (b * tt) / b, trl_jsd(s, t, beta=beta))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("beta", BETAS)
def test_matches_trl_sdpo_compute_divergence(shape, beta):
    loss_utils = pytest.importorskip("trl.experimental.sdpo.loss_utils")
    s, t, _ = _inputs(shape, seed=3)
    s_lp, t_lp = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    theirs = loss_utils.compute_divergence(s_lp, t_lp, beta)
    _rel_close(gjsd_per_token(s_lp, t_lp, beta), theirs)
    _rel_close(generalized_jsd_loss(s, t, beta=beta, reduction="none"), theirs)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_matches_trl_sdpo_renormalised_support_and_reference(k):
    loss_utils = pytest.importorskip("trl.experimental.sdpo.loss_utils")
    s, t, _ = _inputs((2, 4, 16), seed=4)
    ours = generalized_jsd_loss(s, t, beta=0.5, top_k=k, reduction="none")
    _rel_close(ours, ref_per_token(s, t, 0.5, top_k=k))
    # TRL's SDPO top-k uses the *student's* support; swapping the roles (beta -> 1 - beta) makes the
    # teacher's support the one selected, so both must agree exactly.
    theirs = loss_utils.compute_topk_self_distillation_loss(
        t, s, distillation_topk=k, distillation_alpha=0.5, distillation_add_tail=False
    )
    _rel_close(ours, theirs)
    assert not torch.allclose(ours, generalized_jsd_loss(s, t, beta=0.5, reduction="none"))
    if k == 1:  # one token renormalised to probability 1 in both: no divergence left
        assert torch.all(ours == 0)


def test_beta_endpoints_are_forward_and_reverse_kl():
    s, t, labels = _inputs((2, 6, 9), seed=5)
    s_lp, t_lp = torch.log_softmax(s, -1), torch.log_softmax(t, -1)
    keep = labels != -100
    forward = F.kl_div(s_lp, t_lp, log_target=True, reduction="none").sum(-1)  # KL(T || S)
    reverse = F.kl_div(t_lp, s_lp, log_target=True, reduction="none").sum(-1)  # KL(S || T)
    _rel_close(generalized_jsd_loss(s, t, labels, beta=0.0), forward[keep].mean())
    _rel_close(generalized_jsd_loss(s, t, labels, beta=1.0), reverse[keep].mean())
    assert not torch.allclose(forward, reverse)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("opts", [{}, {"temperature": 0.6}, {"top_k": 3}, {"token_clip": 0.05}])
def test_gradcheck(beta, opts):
    s, t, labels = _inputs((2, 3, 5), seed=6, scale=1.0)
    s.requires_grad_(True)
    t.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a, b: generalized_jsd_loss(a, b, labels, beta=beta, **opts), (s, t)
    )


def test_gradcheck_probabilities_input():
    s, t, labels = _inputs((2, 3, 5), seed=7, scale=1.0)
    ps = torch.softmax(s, -1).requires_grad_(True)
    pt = torch.softmax(t, -1).requires_grad_(True)
    fn = lambda a, b: generalized_jsd_loss(a, b, labels, beta=0.3, logits_are_probs=True, temperature=0.8)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (ps, pt))
    # probabilities of logits give the same value as the logits themselves
    _rel_close(fn(ps, pt), generalized_jsd_loss(s, t, labels, beta=0.3, temperature=0.8))


def test_ignored_positions_change_nothing():
    s, t, labels = _inputs((2, 5, 7), seed=8)
    drop = labels == -100
    assert drop.any()
    s1, t1 = s.clone().requires_grad_(True), t.clone().requires_grad_(True)
    s2, t2 = s.clone(), t.clone()
    s2[drop] = torch.randn_like(s2[drop]) * 1e4
    t2[drop] = float("nan")  # even garbage there cannot leak in
    s2.requires_grad_(True)
    for reduction in ("batchmean", "sum", "mean"):
        a = generalized_jsd_loss(s1, t1, labels, reduction=reduction)
        b = generalized_jsd_loss(s2, t2, labels, reduction=reduction)
        assert torch.equal(a, b)
        (ga,) = torch.autograd.grad(a, s1)
        (gb,) = torch.autograd.grad(b, s2)
        assert torch.equal(ga, gb)
        assert torch.all(gb[drop] == 0)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
def test_all_masked_gives_zero_with_gradient(reduction):
    s = torch.randn(2, 3, 5, requires_grad=True)
    labels = torch.full((2, 3), -100)
    out = generalized_jsd_loss(s, torch.randn(2, 3, 5), labels, reduction=reduction)
    assert torch.all(out == 0) and not torch.isnan(out).any()
    out.sum().backward()
    assert s.grad is not None and torch.all(s.grad == 0)


def test_stable_for_large_logits():
    g = torch.Generator().manual_seed(9)
    s = (torch.randn(2, 4, 50, generator=g) * 1e4).requires_grad_(True)
    t = torch.randn(2, 4, 50, generator=g) * 1e4
    for beta in BETAS:
        out = generalized_jsd_loss(s, t, beta=beta)
        (grad,) = torch.autograd.grad(out, s)
        assert torch.isfinite(out) and torch.isfinite(grad).all()
        # the same inputs in float64 agree (no overflow path in float32)
        _rel_close(out, generalized_jsd_loss(s.detach().double(), t.double(), beta=beta), rtol=1e-4)
    # fully saturated distributions: JSD of two different one-hots is log 2 at beta = 0.5
    a = torch.full((1, 1, 4), -1e4)
    b = a.clone()
    a[..., 0], b[..., 1] = 1e4, 1e4
    torch.testing.assert_close(generalized_jsd_loss(a, b), torch.tensor(0.6931471805599453))


def test_temperature_changes_value_as_documented():
    s, t, labels = _inputs((2, 4, 10), seed=10)
    keep = labels != -100
    for temperature in (0.5, 2.0):
        out = generalized_jsd_loss(s, t, labels, temperature=temperature)
        _rel_close(out, ref_per_token(s, t, 0.5, temperature)[keep].mean())
        assert not torch.allclose(out, generalized_jsd_loss(s, t, labels))
        # temperature T on logits z equals temperature 1 on logits z / T
        _rel_close(out, generalized_jsd_loss(s / temperature, t / temperature, labels))


def test_token_clip_caps_each_token():
    s, t, labels = _inputs((3, 5, 12), seed=11)
    keep = labels != -100
    d = ref_per_token(s, t, 0.5)[keep]
    clip = float(d.median())
    out = generalized_jsd_loss(s, t, labels, token_clip=clip)
    _rel_close(out, d.clamp(max=clip).mean())
    assert out < generalized_jsd_loss(s, t, labels)
    s.requires_grad_(True)
    per_token = generalized_jsd_loss(s, t, labels, token_clip=clip, reduction="none")
    per_token.sum().backward()
    clipped = (ref_per_token(s.detach(), t, 0.5) > clip) & keep
    assert clipped.any() and torch.all(s.grad[clipped] == 0)


def test_num_items_in_batch_overrides_reduction():
    s, t, labels = _inputs((2, 4, 6), seed=12)
    total = generalized_jsd_loss(s, t, labels, reduction="sum")
    _rel_close(generalized_jsd_loss(s, t, labels, num_items_in_batch=17), total / 17)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"reduction": "avg"}, "reduction"),
        ({"beta": 1.5}, "beta"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 99}, "top_k"),
        ({"token_clip": -1.0}, "token_clip"),
        ({"labels": torch.zeros(2, 4, dtype=torch.long)}, "labels"),
    ],
)
def test_bad_arguments_raise_naming_them(kwargs, needle):
    s, t = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=needle):
        generalized_jsd_loss(s, t, **kwargs)


def test_bad_tensors_raise():
    with pytest.raises(ValueError, match="same"):
        generalized_jsd_loss(torch.randn(2, 3, 8), torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match="floating-point"):
        generalized_jsd_loss(torch.randint(0, 5, (2, 3, 8)), torch.randn(2, 3, 8))
