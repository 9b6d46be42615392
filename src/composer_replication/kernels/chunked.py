"""Token-chunked loss engine: row-local losses over (N, V) logits without (N, V) temporaries.

The reference distillation losses (`composer_replication.losses`) build a dozen (B, T, V) fp32
temporaries: at the Qwen vocabulary (V = 151936), B = 2, T = 1024 that is ~18.5 GB.
Every one of these losses is a *row-local* function of the logits (token n's loss depends on row n
only) followed by a linear reduction. This engine exploits that, for any such loss:

* a row function ``row_fn(*row_chunks) -> (n,)`` (supplied by the loss family, see
  `composer_replication.losses`) computes the per-token loss of a chunk of rows;
* `chunked_rows` runs it over chunks of the *valid* rows only (masked rows are never touched) and
  never holds more than one chunk's (chunk, V) temporaries;
* for a reduced (scalar) loss the gradient is computed inside the forward pass, chunk by chunk
  (as Liger's fused kernels do), so there is a single pass and backward only scales the stored
  gradient by the incoming scalar; for per-token outputs backward recomputes each chunk instead;
* a row function may carry a closed form ``row_fn.analytic(*row_chunks, w) -> (per_row, grad)``
  (see `kernels.analytic`), used instead of autograd when only the first rows need a gradient.

`kernels.fused_linear` runs the same row functions from hidden states + LM-head weight. Nothing here
knows which loss it computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from composer_replication.kernels.allocator import pin_mmap_threshold

__all__ = ["as_rows", "chunked_rows", "default_chunk_rows", "masked_reduce", "reduce_pair", "reduce_rows"]

# Target bytes of one (chunk, V) fp32 temporary; a chunk needs ~10 of them (values + autograd).
_CHUNK_BYTES = 16 * 2**20


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk so that one (rows, V) fp32 temporary is about 16 MiB (at least 8 rows)."""
    return max(8, _CHUNK_BYTES // (4 * max(int(vocab_size), 1)))


def _grad_buffer(x: torch.Tensor) -> torch.Tensor:
    dtype = torch.promote_types(x.dtype, torch.float32)
    return torch.zeros(x.shape, dtype=dtype, device=x.device)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """(N, V) view of (..., V) logits, or the 3-D tensor itself when a view is impossible.

    ``logits[:, :-1]`` is not viewable as (N, V); reshaping would copy all the logits, so the
    engine gathers such rows per chunk instead (`_take_rows`).
    """
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return x if x.dim() == 3 else x.reshape(-1, x.shape[-1])


def _take_rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    if x.dim() == 3 and idx.dim() == 1:
        return x[idx // x.shape[1], idx % x.shape[1]]
    return x.index_select(0, idx)


def _add_rows(buf: torch.Tensor, idx: torch.Tensor, g: torch.Tensor) -> None:
    g = g.to(buf.dtype)
    if buf.dim() == 3:
        buf.index_put_((idx // buf.shape[1], idx % buf.shape[1]), g, accumulate=True)
    else:
        buf.index_add_(0, idx, g)


def _chunk_inputs(n_row, tensors, idx, needs):
    """Gather one chunk of rows; detach everything and mark what needs a gradient."""
    out: list[torch.Tensor | None] = []
    for i, x in enumerate(tensors):
        if x is None:
            out.append(None)
            continue
        y = _take_rows(x, idx) if i < n_row else x
        y = y.detach()
        if needs[i]:
            y.requires_grad_(True)
        out.append(y)
    return out


def _accumulate(
    grads: list[Any], needs: Sequence[bool], n_row: int, idx: torch.Tensor, chunk_grads: Sequence[Any]
) -> None:
    """Add one chunk's gradients (one per tensor that needs one, None where unused) into ``grads``:
    the first ``n_row`` tensors' at the chunk's rows ``idx``, the others' (whole tensors) by ``+=``."""
    gs = iter(chunk_grads)
    for i, nd in enumerate(needs):
        if not nd:
            continue
        g = next(gs)
        if g is None:
            continue
        if i < n_row:
            _add_rows(grads[i], idx, g)
        else:
            grads[i] += g


class _ChunkedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, row_fn, valid_idx, weights, chunk, n_row, *tensors):
        needs = [bool(n) for n in ctx.needs_input_grad[5:]]
        want_grad = any(needs)
        n_valid = valid_idx.numel()
        ref = next(x for x in tensors if x is not None)
        if ref.device.type == "cpu":
            pin_mmap_threshold()  # freed tiles would otherwise stay resident (see allocator.py)
        out_dtype = torch.promote_types(ref.dtype, torch.float32)
        ctx.row_fn, ctx.chunk, ctx.n_row, ctx.scalar = row_fn, chunk, n_row, weights is not None
        if weights is None:  # per-row output; backward recomputes each chunk
            losses = torch.empty(n_valid, dtype=out_dtype, device=ref.device)
            with torch.no_grad():
                for a in range(0, n_valid, chunk):
                    idx = valid_idx[a : a + chunk]
                    xs = _chunk_inputs(n_row, tensors, idx, [False] * len(tensors))
                    losses[a : a + chunk] = row_fn(*xs)
            ctx.save_for_backward(valid_idx, *tensors)
            ctx.needs = needs
            return losses
        total = torch.zeros((), dtype=out_dtype, device=ref.device)
        grads: list[Any] = [
            _grad_buffer(x) if (x is not None and nd) else None for x, nd in zip(tensors, needs)
        ]
        # Closed-form value and gradient (kernels.analytic) when only the first rows need a gradient
        # and the tiles are full precision; it declines (None) on non-finite rows -> autograd below.
        analytic: Any = getattr(row_fn, "analytic", None)
        fast = (
            analytic is not None
            and needs[:1] == [True]
            and not any(needs[1:])
            and all(x is None or x.dtype in (torch.float32, torch.float64) for x in tensors)
        )
        for a in range(0, n_valid, chunk):
            idx = valid_idx[a : a + chunk]
            w = weights[a : a + chunk]
            if fast:
                out = analytic(*_chunk_inputs(n_row, tensors, idx, [False] * len(tensors)), w)
                if out is not None:
                    per, g = out
                    total += (per * w.to(per.dtype)).sum()
                    _add_rows(grads[0], idx, g)
                    continue
            xs = _chunk_inputs(n_row, tensors, idx, needs)
            with torch.enable_grad() if want_grad else torch.no_grad():
                val = (row_fn(*xs) * w).sum()
            total += val.detach()
            if want_grad:
                wrt = [x for x, nd in zip(xs, needs) if nd]
                _accumulate(grads, needs, n_row, idx, torch.autograd.grad(val, wrt, allow_unused=True))
        ctx.grads = grads
        ctx.dtypes = [None if x is None else x.dtype for x in tensors]
        return total

    @staticmethod
    def backward(ctx, grad_out):
        head = (None, None, None, None, None)
        if ctx.scalar:
            if ctx.grads is None:
                raise RuntimeError(
                    "a chunked loss can be backpropagated once (its gradient is consumed in place)"
                )
            res = []
            for g, dt in zip(ctx.grads, ctx.dtypes):
                # In place: a second (B, T, V) gradient copy would double the backward's peak.
                res.append(None if g is None else g.mul_(grad_out).to(dt))
            ctx.grads = None
            return (*head, *res)
        valid_idx, *tensors = ctx.saved_tensors
        tensors = [t for t in tensors]
        needs, n_row, chunk = ctx.needs, ctx.n_row, ctx.chunk
        grads: list[Any] = [
            _grad_buffer(x) if (x is not None and nd) else None for x, nd in zip(tensors, needs)
        ]
        for a in range(0, valid_idx.numel(), chunk):
            idx = valid_idx[a : a + chunk]
            xs = _chunk_inputs(n_row, tensors, idx, needs)
            with torch.enable_grad():
                val = ctx.row_fn(*xs)
            wrt = [x for x, nd in zip(xs, needs) if nd]
            g_out = grad_out[a : a + chunk].to(val.dtype)
            _accumulate(
                grads, needs, n_row, idx, torch.autograd.grad(val, wrt, grad_outputs=g_out, allow_unused=True)
            )
        res = [None if g is None else g.to(x.dtype) for g, x in zip(grads, tensors)]
        return (*head, *res)


def chunked_rows(
    row_fn: Callable[..., torch.Tensor],
    row_tensors: Sequence[torch.Tensor | None],
    *,
    valid_idx: torch.Tensor,
    weights: torch.Tensor | None = None,
    chunk_rows: int = 256,
) -> torch.Tensor:
    """Apply ``row_fn`` over chunks of the rows ``valid_idx`` of the (N, ...) ``row_tensors``.

    Returns ``Σ_i weights[i]·row_fn(rows)[i]`` (a scalar; gradient computed in the forward pass)
    when ``weights`` (one per valid row) is given, else the (n_valid,) per-row losses (gradient by
    recomputation in backward).
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return _ChunkedRows.apply(row_fn, valid_idx, weights, int(chunk_rows), len(row_tensors), *row_tensors)


def masked_reduce(
    run: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    mask_N: torch.Tensor,
    denom: torch.Tensor | float | None,
    out_shape: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Turn a plan (``mask_N``, ``denom``) into an engine call ``run(valid_idx, weights)``.

    Returns ``Σ_n mask_n·ℓ_n / denom`` (``run`` gets one weight per valid row); with ``denom=None`` the
    per-token ``mask·ℓ`` in ``out_shape`` (``run`` gets ``weights=None`` and returns per-row losses).
    Rows with ``mask_N == 0`` are never computed; ``mask_N`` may hold float weights.
    """
    valid_idx = mask_N.nonzero().squeeze(-1)
    mvals = mask_N.index_select(0, valid_idx).to(dtype)
    if denom is None:
        per = run(valid_idx, None)
        out = torch.zeros(mask_N.shape[0], dtype=per.dtype, device=per.device)
        return out.index_put((valid_idx,), per * mvals).view(out_shape)
    return run(valid_idx, mvals / denom)


def reduce_rows(
    row_fn: Callable[..., torch.Tensor],
    row_tensors: Sequence[torch.Tensor | None],
    *,
    mask_N: torch.Tensor,
    denom: torch.Tensor | float | None,
    out_shape: tuple[int, ...],
    chunk_rows: int,
) -> torch.Tensor:
    """`masked_reduce` on the chunked engine: ``Σ_n mask_n·ℓ_n / denom`` or per-token values."""
    ref = next(x for x in row_tensors if x is not None)
    dtype = torch.promote_types(ref.dtype, torch.float32)

    def run(valid_idx: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        return chunked_rows(row_fn, row_tensors, valid_idx=valid_idx, weights=weights, chunk_rows=chunk_rows)

    return masked_reduce(run, mask_N, denom, out_shape, dtype)


def reduce_pair(
    row_fn: Callable[..., torch.Tensor],
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    mask_N: torch.Tensor,
    denom: torch.Tensor | float | None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`reduce_rows` of ``row_fn(student_rows, teacher_rows)`` over two ``(..., V)`` logits tensors."""
    *lead, V = student_logits.shape
    return reduce_rows(
        row_fn,
        [as_rows(student_logits), as_rows(teacher_logits)],
        mask_N=mask_N,
        denom=denom,
        out_shape=tuple(lead),
        chunk_rows=chunk_rows or default_chunk_rows(V),
    )
