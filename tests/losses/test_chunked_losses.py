"""Chunked and fused-linear losses equal the reference path (values and gradients).

References: `opsd.generalized_jsd_loss`, `distillation.taid_loss`, `distillation.entropy_aware_opd_loss`,
`F.cross_entropy`, and a float64 GJSD written out below. Tolerances: 1e-10 in float64, 1e-5 in float32.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from composer_replication.distillation import entropy_aware_opd_loss, taid_loss
from composer_replication.kernels.fused_linear import LMHead
from composer_replication.losses.ce import (
    chunked_cross_entropy,
    chunked_token_logprobs,
    fused_cross_entropy,
    fused_token_logprobs,
)
from composer_replication.losses.eopd import chunked_entropy_aware_opd_loss, fused_entropy_aware_opd_loss
from composer_replication.losses.gjsd import chunked_generalized_jsd_loss, fused_generalized_jsd_loss
from composer_replication.losses.taid import chunked_taid_loss, fused_taid_loss
from composer_replication.opsd import generalized_jsd_loss

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
B, T, V, H = 2, 7, 37, 12


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    err = (a.detach().double() - b.detach().double()).abs().max().item()
    scale = max(1.0, b.detach().double().abs().max().item())
    assert err <= TOL[dtype] * scale, f"max |diff| {err:.3e} > {TOL[dtype]:.0e}"


def _labels(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lab = torch.randint(0, V, (B, T), generator=g)
    lab[0, :3] = -100
    lab[1, -1] = -100
    return lab


def _pair(dtype, teacher_grad=False, scale=3.0):
    g = torch.Generator().manual_seed(1)
    s = (scale * torch.randn(B, T, V, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()
    t = (
        (scale * torch.randn(B, T, V, generator=g, dtype=torch.float64))
        .to(dtype)
        .requires_grad_(teacher_grad)
    )
    return s, t


def _grads(out: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    if out.dim() > 0:  # weight the per-token output so the test sees every position's gradient
        w = torch.arange(1, out.numel() + 1, dtype=out.dtype).view_as(out)
        out = (out * w).sum()
    return list(torch.autograd.grad(out, inputs))


def _gjsd_f64(s, t, labels, beta, temperature, top_k, token_clip):
    """GJSD written out in float64 with explicit probabilities (independent of opsd's helpers)."""
    s, t = s.double() / temperature, t.double() / temperature
    if top_k is not None:
        idx = t.topk(top_k, dim=-1).indices
        s, t = s.gather(-1, idx), t.gather(-1, idx)
    ps, pt = torch.softmax(s, -1), torch.softmax(t, -1)
    if beta == 0:
        d = (pt * (pt.log() - ps.log())).sum(-1)
    elif beta == 1:
        d = (ps * (ps.log() - pt.log())).sum(-1)
    else:
        m = (1 - beta) * ps + beta * pt
        d = beta * (pt * (pt.log() - m.log())).sum(-1) + (1 - beta) * (ps * (ps.log() - m.log())).sum(-1)
    if token_clip is not None:
        d = d.clamp(max=token_clip)
    keep = labels != -100
    return d[keep].sum() / keep.sum()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"temperature": 0.7},
        {"top_k": 5},
        {"token_clip": 0.5},
        {"temperature": 1.3, "top_k": 9, "token_clip": 0.8},
        {"no_labels": True},
    ],
)
def test_gjsd_chunked_and_fused_match_reference(dtype, beta, reduction, opts):
    opts = dict(opts)
    labels = None if opts.pop("no_labels", False) else _labels()
    kw = dict(beta=beta, reduction=reduction, **opts)
    s, t = _pair(dtype, teacher_grad=True)
    ref = generalized_jsd_loss(s, t, labels, **kw)
    out = chunked_generalized_jsd_loss(s, t, labels, chunk_rows=3, **kw)
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [s, t]), _grads(ref, [s, t])):
        _close(a, b, dtype)

    # Fused-linear: the same loss from hidden states and an LM head with bias.
    g = torch.Generator().manual_seed(2)
    hs = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ht = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    bias = torch.randn(V, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    head = LMHead(w, bias)
    ref = generalized_jsd_loss(head.logits(hs), head.detached().logits(ht), labels, **kw)
    out = fused_generalized_jsd_loss(hs, ht, head, labels, chunk_rows=4, **kw)
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [hs, w, bias]), _grads(ref, [hs, w, bias])):
        _close(a, b, dtype)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("opts", [{}, {"temperature": 0.8, "top_k": 6}, {"token_clip": 0.3}])
def test_gjsd_matches_float64_formula(beta, opts):
    s, t = _pair(torch.float64)
    labels = _labels()
    ref = _gjsd_f64(
        s, t, labels, beta, opts.get("temperature", 1.0), opts.get("top_k"), opts.get("token_clip")
    )
    out = chunked_generalized_jsd_loss(s, t, labels, beta=beta, chunk_rows=5, **opts)
    _close(out, ref, torch.float64)
    _close(torch.autograd.grad(out, s)[0], torch.autograd.grad(ref, s)[0], torch.float64)


def test_gjsd_logits_are_probs_and_num_items():
    s, t = _pair(torch.float64)
    ps = torch.softmax(s, -1).detach().requires_grad_()
    pt = torch.softmax(t, -1).detach()
    labels = _labels()
    for kw in ({"temperature": 1.0}, {"temperature": 0.6, "top_k": 4}):
        ref = generalized_jsd_loss(ps, pt, labels, logits_are_probs=True, **kw)
        out = chunked_generalized_jsd_loss(ps, pt, labels, logits_are_probs=True, chunk_rows=2, **kw)
        _close(out, ref, torch.float64)
        _close(torch.autograd.grad(out, ps)[0], torch.autograd.grad(ref, ps)[0], torch.float64)
    ref = generalized_jsd_loss(s, t, labels, num_items_in_batch=17)
    out = chunked_generalized_jsd_loss(s, t, labels, num_items_in_batch=17, chunk_rows=3)
    _close(out, ref, torch.float64)


def test_gjsd_all_masked_and_extreme_logits():
    s, t = _pair(torch.float64)
    labels = torch.full((B, T), -100)
    out = chunked_generalized_jsd_loss(s, t, labels)
    assert out.item() == 0.0
    assert torch.autograd.grad(out, s)[0].abs().max().item() == 0.0
    big = (s.detach() * 1e4).requires_grad_()
    ref = generalized_jsd_loss(big, t * 1e4, _labels())
    out = chunked_generalized_jsd_loss(big, t * 1e4, _labels(), chunk_rows=4)
    assert torch.isfinite(out)
    _close(out, ref, torch.float64)
    _close(torch.autograd.grad(out, big)[0], torch.autograd.grad(ref, big)[0], torch.float64)


def test_errors_match_reference():
    s, t = _pair(torch.float32)
    with pytest.raises(ValueError, match="reduction"):
        chunked_generalized_jsd_loss(s, t, reduction="avg")
    with pytest.raises(ValueError, match="same"):
        chunked_generalized_jsd_loss(s, t[..., :-1])
    head = LMHead(torch.randn(V, H))
    with pytest.raises(ValueError, match="reduction"):
        fused_generalized_jsd_loss(torch.randn(B, T, H), torch.randn(B, T, H), head, reduction="avg")
    with pytest.raises(ValueError, match="beta"):
        fused_generalized_jsd_loss(torch.randn(B, T, H), torch.randn(B, T, H), head, beta=1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        chunked_taid_loss(s, t, t=1.2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tcoef", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("masked", [False, True])
def test_taid_matches_reference(dtype, tcoef, masked):
    s, t = _pair(dtype, teacher_grad=True)
    mask = (_labels() != -100).to(dtype) if masked else None
    ref = taid_loss(s, t, mask, t=tcoef)
    out = chunked_taid_loss(s, t, mask, t=tcoef, chunk_rows=3)
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [s, t]), _grads(ref, [s, t])):
        _close(a, b, dtype)
    g = torch.Generator().manual_seed(3)
    hs = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ht = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    head = LMHead(w)
    ref = taid_loss(head.logits(hs), head.detached().logits(ht), mask, t=tcoef)
    out = fused_taid_loss(hs, ht, head, mask, t=tcoef, chunk_rows=5)
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [hs, w]), _grads(ref, [hs, w])):
        _close(a, b, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize(
    "opts", [{}, {"temperature": 0.7, "h_max": 2.0}, {"labels": "mask01"}, {"labels": "hf"}]
)
def test_entropy_aware_opd_matches_reference(dtype, reduction, opts):
    opts = dict(opts)
    lab = opts.pop("labels", None)
    labels = None
    if lab == "mask01":
        labels = (_labels() != -100).long()
    elif lab == "hf":
        labels = _labels()
    s, t = _pair(dtype)
    ref = entropy_aware_opd_loss(s, t, labels=labels, reduction=reduction, **opts)
    out = chunked_entropy_aware_opd_loss(s, t, labels=labels, reduction=reduction, chunk_rows=4, **opts)
    _close(out, ref, dtype)
    _close(_grads(out, [s])[0], _grads(ref, [s])[0], dtype)
    g = torch.Generator().manual_seed(4)
    hs = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ht = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    head = LMHead(w, softcap=4.0)
    ref = entropy_aware_opd_loss(
        head.logits(hs), head.detached().logits(ht), labels=labels, reduction=reduction, **opts
    )
    out = fused_entropy_aware_opd_loss(hs, ht, head, labels=labels, reduction=reduction, chunk_rows=3, **opts)
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [hs, w]), _grads(ref, [hs, w])):
        _close(a, b, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_token_logprobs_and_cross_entropy(dtype, smoothing):
    s, _ = _pair(dtype)
    labels = _labels()
    ref_lp = torch.log_softmax(s, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (labels != -100)
    out = chunked_token_logprobs(s, labels, chunk_rows=3)
    _close(out, ref_lp, dtype)
    _close(_grads(out, [s])[0], _grads(ref_lp, [s])[0], dtype)
    ref = F.cross_entropy(s.reshape(-1, V), labels.reshape(-1), label_smoothing=smoothing)
    out = chunked_cross_entropy(s.reshape(-1, V), labels.reshape(-1), label_smoothing=smoothing, chunk_rows=4)
    _close(out, ref, dtype)
    _close(torch.autograd.grad(out, s)[0], torch.autograd.grad(ref, s)[0], dtype)

    g = torch.Generator().manual_seed(5)
    h = torch.randn(B, T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    bias = torch.randn(V, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    head = LMHead(w, bias, softcap=5.0)
    z = head.logits(h)
    ref_lp = torch.log_softmax(z, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (labels != -100)
    out = fused_token_logprobs(h, head, labels, chunk_rows=3)
    _close(out, ref_lp, dtype)
    for a, b in zip(_grads(out, [h, w, bias]), _grads(ref_lp, [h, w, bias])):
        _close(a, b, dtype)
    ref = F.cross_entropy(head.logits(h).reshape(-1, V), labels.reshape(-1), label_smoothing=smoothing)
    out = fused_cross_entropy(
        h.reshape(-1, H), head, labels.reshape(-1), label_smoothing=smoothing, chunk_rows=5
    )
    _close(out, ref, dtype)
    for a, b in zip(_grads(out, [h, w, bias]), _grads(ref, [h, w, bias])):
        _close(a, b, dtype)


def test_tied_head_and_teacher_gradient_through_shared_weight():
    """A teacher head that *does* take gradients (same weight) adds its share, as autograd would."""
    g = torch.Generator().manual_seed(6)
    hs = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    ht = torch.randn(B, T, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    head = LMHead(w)
    labels = _labels()
    ref = generalized_jsd_loss(head.logits(hs), head.logits(ht), labels, beta=0.5)
    out = fused_generalized_jsd_loss(hs, ht, head, labels, beta=0.5, teacher_head=head, chunk_rows=4)
    _close(out, ref, torch.float64)
    for a, b in zip(_grads(out, [hs, ht, w]), _grads(ref, [hs, ht, w])):
        _close(a, b, torch.float64)


def test_no_grad_and_bf16_inputs():
    s, t = _pair(torch.float32)
    with torch.no_grad():
        out = chunked_generalized_jsd_loss(s, t, _labels())
    assert not out.requires_grad
    _close(out, generalized_jsd_loss(s, t, _labels()), torch.float32)
    g = torch.Generator().manual_seed(7)
    h = torch.randn(B, T, H, generator=g).bfloat16().requires_grad_()
    w = torch.randn(V, H, generator=g).bfloat16().requires_grad_()
    head = LMHead(w)
    out = fused_token_logprobs(h, head, _labels())
    assert out.dtype == torch.float32
    ref = torch.log_softmax(head.logits(h), -1).gather(-1, _labels().clamp_min(0)[..., None])[..., 0]
    ref = ref * (_labels() != -100)
    assert (out - ref).abs().max().item() < 1e-5
    gh, gw = _grads(out, [h, w])
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    rh, rw = _grads(ref, [h, w])
    assert (gh.float() - rh.float()).abs().max().item() < 0.05 * max(1.0, rh.float().abs().max().item())


def test_real_qwen_vocabulary_small_T():
    """One check at V = 151936 (Qwen): chunked and fused against the reference, T = 3."""
    Vq, Hq, Tq = 151936, 16, 3
    g = torch.Generator().manual_seed(8)
    hs = torch.randn(1, Tq, Hq, generator=g, requires_grad=True)
    ht = torch.randn(1, Tq, Hq, generator=g)
    w = (0.5 * torch.randn(Vq, Hq, generator=g)).requires_grad_()
    head = LMHead(w)
    labels = torch.tensor([[5, -100, 151935]])
    zs, zt = head.logits(hs), head.detached().logits(ht)
    ref = generalized_jsd_loss(zs, zt, labels, beta=0.5, top_k=64)
    out = chunked_generalized_jsd_loss(zs, zt, labels, beta=0.5, top_k=64)
    fused = fused_generalized_jsd_loss(hs, ht, head, labels, beta=0.5, top_k=64)
    assert math.isfinite(ref.item())
    _close(out, ref, torch.float32)
    _close(fused, ref, torch.float32)
    ref_g = torch.autograd.grad(ref, [hs, w])
    for a, b in zip(torch.autograd.grad(fused, [hs, w]), ref_g):
        _close(a, b, torch.float32)
    full = generalized_jsd_loss(zs, zt, labels, beta=0.0)
    _close(fused_generalized_jsd_loss(hs, ht, head, labels, beta=0.0), full, torch.float32)


def test_non_contiguous_logits_slices():
    """``logits[:, :-1]`` cannot be viewed as (N, V): rows are gathered per chunk, not copied whole."""
    g = torch.Generator().manual_seed(9)
    full_s = torch.randn(B, T + 1, V, generator=g, dtype=torch.float64, requires_grad=True)
    full_t = torch.randn(B, T + 1, V, generator=g, dtype=torch.float64)
    s, t = full_s[:, :-1], full_t[:, :-1]
    labels = _labels()
    for reduction in ("batchmean", "none"):
        ref = generalized_jsd_loss(s, t, labels, beta=0.3, reduction=reduction)
        out = chunked_generalized_jsd_loss(s, t, labels, beta=0.3, reduction=reduction, chunk_rows=4)
        _close(out, ref, torch.float64)
        _close(_grads(out, [full_s])[0], _grads(ref, [full_s])[0], torch.float64)
    ref_lp = torch.log_softmax(s, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (labels != -100)
    out = chunked_token_logprobs(s, labels, chunk_rows=3)
    _close(out, ref_lp, torch.float64)
    _close(_grads(out, [full_s])[0], _grads(ref_lp, [full_s])[0], torch.float64)
