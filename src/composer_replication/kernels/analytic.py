"""Closed-form value-and-gradient rows: the protocol the engines use, and in-place tile helpers.

For row losses whose gradient with respect to the logits has a short closed form, the engines compute
the value and the gradient together, in place on the chunk's freshly projected logits tile, instead of
recording an autograd graph over (chunk, V) temporaries and differentiating it (fewer passes over the
tile, fewer live tiles). A loss family opts in by wrapping its row function in `RowFn` with the closed
form as ``analytic``::

    row_fn.analytic(*logits_tiles, *extra_tiles, w) -> (per_row ℓ, ∂(Σ_n w_n·ℓ_n)/∂(first tile)) | None

with the same tiles the row function gets and ``w`` the weight of each row in the reduced loss. It
returns ``None`` before touching its inputs when the closed form does not apply exactly (non-finite
logits), and the engine falls back to autograd for that chunk; otherwise it may overwrite the tiles
(the engine owns them). The closed forms themselves live with their loss families in
`composer_replication.losses`; the helpers below are what they share.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["RowFn", "all_finite", "log_softmax_"]


class RowFn:
    """A row function ``rows(*tiles) -> per_row`` with its closed form ``analytic`` (None: autograd only)."""

    def __init__(
        self,
        rows: Callable[..., torch.Tensor],
        analytic: Callable[..., tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    ) -> None:
        self.rows, self.analytic = rows, analytic

    def __call__(self, *tiles: torch.Tensor) -> torch.Tensor:
        return self.rows(*tiles)


def all_finite(*xs: torch.Tensor) -> bool:
    """Every entry of every tensor is finite (the closed forms' precondition)."""
    return all(bool(torch.isfinite(x).all()) for x in xs)


def log_softmax_(z: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(z / temperature)`` over the last axis, in place on ``z`` (which it returns)."""
    if temperature != 1.0:
        z.div_(temperature)
    # As log_softmax does: shift by the max first (exact), then subtract the small log-sum; subtracting
    # a rounded max + log-sum in one go would cost ~|max|·eps in every entry.
    z.sub_(z.amax(dim=-1, keepdim=True))
    return z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))
