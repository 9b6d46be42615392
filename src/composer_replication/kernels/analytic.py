"""Closed-form value-and-gradient row functions for the fused-linear engine.

For the row losses whose gradient with respect to the logits has a short closed form, the fused engine
computes the value and the gradient together, in place on the chunk's freshly projected logits tile,
instead of recording an autograd graph over (chunk, V) temporaries and differentiating it (fewer passes
over the tile, fewer live tiles). Values and gradients equal the autograd path's to rounding (tests
compare both in fp64). Each function returns ``None`` before touching its inputs when the closed form
does not apply exactly (non-finite logits), and the engine falls back to autograd for that chunk.

Notation: ``s``, ``t`` the student and teacher log-probs at temperature τ, ``p = e^s``, ``q = e^t``,
``w`` the weight of each row in the reduced loss ``Σ_n w_n·ℓ_n``; gradients are of that sum with respect
to the student logits ``z``:

- generalized JSD, 0 < β < 1: ``log m = logaddexp(s + log(1-β), t + log β)``,
  ``ℓ = β·Σ q(t - log m) + (1-β)·Σ p(s - log m)``, ``∂ℓ/∂z = (1-β)·p·(s - log m - KL(S‖m)) / τ``;
- β = 0, ``ℓ = KL(T‖S) = Σ q(t - s)``, ``∂ℓ/∂z = (p - q) / τ``;
- β = 1, ``ℓ = KL(S‖T) = Σ p(s - t)``, ``∂ℓ/∂z = p·(s - t - ℓ) / τ``;
- ``token_clip``: a row with ``ℓ > clip`` takes the value ``clip`` and no gradient (``clamp``'s rule);
- cross-entropy with label smoothing ε: ``ℓ = -(1-ε)·s_y - ε·mean_v s_v``,
  ``∂ℓ/∂z = p - (1-ε)·onehot(y) - ε/V``;
- log-probability of the label: ``ℓ = s_y``, ``∂ℓ/∂z = onehot(y) - p``.

The functions overwrite their logits arguments (the engine owns those tiles).
"""

from __future__ import annotations

import math

import torch

__all__ = ["ce_value_grad", "gjsd_value_grad", "logprob_value_grad"]


def _finite(*xs: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(x).all()) for x in xs)


def _log_softmax_(z: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    if temperature != 1.0:
        z.div_(temperature)
    # As log_softmax does: shift by the max first (exact), then subtract the small log-sum; subtracting
    # a rounded max + log-sum in one go would cost ~|max|·eps in every entry.
    z.sub_(z.amax(dim=-1, keepdim=True))
    return z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))


def gjsd_value_grad(
    zs: torch.Tensor,
    zt: torch.Tensor,
    w: torch.Tensor,
    *,
    beta: float,
    temperature: float = 1.0,
    token_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(per-row ℓ, ∂(Σ w·ℓ)/∂zs) for `kernels.rows.gjsd_rows` without top-k; None if not finite."""
    if not _finite(zs, zt):
        return None
    s = _log_softmax_(zs, temperature)
    t = _log_softmax_(zt, temperature)
    p = s.exp()
    if beta == 0:
        q = t.exp()
        per = torch.mul(q, t.sub_(s), out=t).sum(-1)  # Σ q (t - s)
        g = p.sub_(q)
    elif beta == 1:
        d = t.neg_().add_(s)  # s - t
        per = torch.mul(p, d, out=s).sum(-1)
        g = d.sub_(per[:, None]).mul_(p)
    else:
        lm = s + math.log1p(-beta)
        lm = torch.logaddexp(lm, t + math.log(beta), out=lm)
        q = t.exp()
        t.sub_(lm)  # t - log m
        v_t = torch.mul(q, t, out=q).sum(-1)
        del q
        s.sub_(lm)  # s - log m
        del lm
        v_s = torch.mul(p, s, out=t).sum(-1)  # KL(S‖m)
        per = beta * v_t + (1 - beta) * v_s
        g = s.sub_(v_s[:, None]).mul_(p).mul_(1 - beta)
    coef = w.to(g.dtype) / temperature
    if token_clip is not None:
        coef = coef * (per <= token_clip).to(g.dtype)
        per = per.clamp(max=token_clip)
    return per, g.mul_(coef[:, None])


def ce_value_grad(
    z: torch.Tensor, labels: torch.Tensor, w: torch.Tensor, *, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(per-row ℓ, ∂(Σ w·ℓ)/∂z) for `kernels.rows.ce_rows`; None if not finite."""
    if not _finite(z):
        return None
    eps = float(label_smoothing)
    s = _log_softmax_(z)
    y = labels.long().unsqueeze(-1)
    per = -s.gather(-1, y).squeeze(-1)
    if eps:
        per = (1 - eps) * per - eps * s.mean(-1)
    g = s.exp_()
    if eps:
        g.sub_(eps / g.shape[-1])
    g.scatter_add_(-1, y, torch.full_like(per, -(1 - eps)).unsqueeze(-1))
    return per, g.mul_(w.to(g.dtype)[:, None])


def logprob_value_grad(
    z: torch.Tensor, labels: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(per-row log p(label), ∂(Σ w·ℓ)/∂z) for `kernels.rows.logprob_rows`; None if not finite."""
    if not _finite(z):
        return None
    s = _log_softmax_(z)
    y = labels.long().unsqueeze(-1)
    per = s.gather(-1, y).squeeze(-1)
    g = s.exp_().neg_()
    g.scatter_add_(-1, y, torch.ones_like(per).unsqueeze(-1))
    return per, g.mul_(w.to(g.dtype)[:, None])
