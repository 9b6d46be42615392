"""Closed-form value-and-gradient rows (`kernels.analytic`) equal autograd through the row functions.

Float64, 1e-10. Also: non-finite logits make them decline (None, inputs untouched) and the fused engine
then falls back to autograd with the same result as the reference path.
"""

from __future__ import annotations

import pytest
import torch

from composer_replication.kernels.fused_linear import LMHead
from composer_replication.losses.ce import (
    ce_rows,
    ce_value_grad,
    fused_cross_entropy,
    logprob_rows,
    logprob_value_grad,
)
from composer_replication.losses.gjsd import fused_generalized_jsd_loss, gjsd_rows, gjsd_value_grad
from composer_replication.opsd import generalized_jsd_loss

N, V = 9, 41


def _z(seed: int, scale: float = 4.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(N, V, generator=g, dtype=torch.float64)


def _w() -> torch.Tensor:
    return torch.linspace(0.2, 2.0, N, dtype=torch.float64)


def _autograd(fn, z, *rest):
    z = z.clone().requires_grad_()
    per = fn(z, *rest)
    (g,) = torch.autograd.grad((per * _w()).sum(), z)
    return per.detach(), g


def _close(a, b):
    assert (a - b).abs().max().item() <= 1e-10 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("token_clip", [None, 0.4])
def test_gjsd_closed_form_equals_autograd(beta, temperature, token_clip):
    zs, zt = _z(0), _z(1)
    ref_per, ref_g = _autograd(
        lambda z: gjsd_rows(z, zt, beta=beta, temperature=temperature, token_clip=token_clip), zs
    )
    per, g = gjsd_value_grad(
        zs.clone(), zt.clone(), _w(), beta=beta, temperature=temperature, token_clip=token_clip
    )
    _close(per, ref_per)
    _close(g, ref_g)
    if token_clip is not None:
        assert bool((ref_per >= token_clip).any()), (
            "the clip must bind on some row for this test to mean anything"
        )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_ce_and_logprob_closed_forms_equal_autograd(eps):
    z = _z(2)
    y = torch.arange(N) * 3 % V
    ref_per, ref_g = _autograd(lambda x: ce_rows(x, y, label_smoothing=eps), z)
    per, g = ce_value_grad(z.clone(), y, _w(), label_smoothing=eps)
    _close(per, ref_per)
    _close(g, ref_g)
    ref_per, ref_g = _autograd(lambda x: logprob_rows(x, y), z)
    per, g = logprob_value_grad(z.clone(), y, _w())
    _close(per, ref_per)
    _close(g, ref_g)


def test_non_finite_logits_decline_and_the_fused_engine_falls_back():
    zs, zt = _z(0), _z(1)
    zs[0, 3] = float("-inf")
    before = zs.clone()
    assert gjsd_value_grad(zs, zt.clone(), _w(), beta=0.5) is None
    assert torch.equal(zs, before), "a declining closed form must leave its inputs untouched"
    assert ce_value_grad(zs, torch.zeros(N, dtype=torch.long), _w()) is None

    # A bias of -inf on one vocabulary entry (a banned token): the engine falls back to autograd.
    g = torch.Generator().manual_seed(3)
    H = 6
    hs = torch.randn(2, 5, H, generator=g, dtype=torch.float64).requires_grad_()
    ht = torch.randn(2, 5, H, generator=g, dtype=torch.float64)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).requires_grad_()
    bias = torch.zeros(V, dtype=torch.float64)
    bias[7] = float("-inf")
    head = LMHead(w, bias)
    ref = generalized_jsd_loss(head.logits(hs), head.detached().logits(ht), beta=0.5)
    out = fused_generalized_jsd_loss(hs, ht, head, beta=0.5, chunk_rows=3)
    _close(out.detach(), ref.detach())
    for a, b in zip(torch.autograd.grad(out, [hs, w]), torch.autograd.grad(ref, [hs, w])):
        assert torch.isfinite(a).all()
        _close(a, b)
    labels = torch.arange(10) % 5
    ref = torch.nn.functional.cross_entropy(head.logits(hs).reshape(10, V), labels)
    out = fused_cross_entropy(hs.reshape(10, H), head, labels, chunk_rows=4)
    _close(out.detach(), ref.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("reduction", ["batchmean", "none"])
def test_chunked_engine_closed_form_path_matches_reference(dtype, beta, reduction):
    """Teacher without gradient: the chunked engine takes the closed form (scalar) or recomputes (none)."""
    from composer_replication.losses.gjsd import chunked_generalized_jsd_loss

    tol = 1e-10 if dtype == torch.float64 else 1e-5
    s = _z(4).reshape(3, 3, V).to(dtype).requires_grad_()
    t = _z(5).reshape(3, 3, V).to(dtype)
    labels = torch.tensor([[0, -100, 2], [1, 1, -100], [3, 4, 5]])
    kw = dict(beta=beta, temperature=0.8, reduction=reduction)
    ref = generalized_jsd_loss(s, t, labels, **kw)
    out = chunked_generalized_jsd_loss(s, t, labels, chunk_rows=2, **kw)
    wts = torch.arange(1, ref.numel() + 1, dtype=dtype).view_as(ref)
    (g_ref,) = torch.autograd.grad((ref * wts).sum(), s)
    (g_out,) = torch.autograd.grad((out * wts).sum(), s)
    for a, b in ((out.detach(), ref.detach()), (g_out, g_ref)):
        assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())
