"""Fused LM-head + loss engine: row-local losses from hidden states, never building (N, V) logits.

Input is the final hidden states (N, H) of one or more streams (student, teacher) and each stream's
LM head (V, H) (+ optional bias, optional final-logit soft-capping). Tokens are processed in chunks:
project one chunk to (chunk, V) logits, compute the per-token loss with the family's row function
(the same one the chunked engine runs, see `composer_replication.losses`), and, in the same pass, the
gradient with respect to the chunk's logits, which is immediately folded into ``grad_hidden`` (a
(chunk, H) matmul) and accumulated **in place** into ``grad_weight`` (``addmm_``), so no (V, H)
temporary is created per chunk. Only one chunk of logits ever exists (Liger-Kernel's fused-linear
scheme, in plain PyTorch; see docs/large_vocab.md).

For a reduced (scalar) loss backward only scales the stored gradients; for per-token outputs backward
recomputes each chunk. A row function's closed form (``row_fn.analytic``, `kernels.analytic`) replaces
autograd when only the student stream needs a gradient and there is no soft-cap. Nothing here knows
which loss it computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from composer_replication.kernels.allocator import pin_mmap_threshold
from composer_replication.kernels.chunked import masked_reduce

__all__ = [
    "HiddenPair",
    "LMHead",
    "default_fused_chunk_rows",
    "fused_rows",
    "hidden_pair",
    "reduce_fused",
]

_CHUNK_BYTES = 40 * 2**20


def default_fused_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk so that one (rows, V) fp32 logits tile is about 40 MiB (at least 16 rows)."""
    return max(16, _CHUNK_BYTES // (4 * max(int(vocab_size), 1)))


@dataclass(frozen=True)
class LMHead:
    """An output projection ``logits = softcap(hidden @ weight.T + bias)``.

    ``softcap`` is Gemma-2's ``final_logit_softcapping``: ``c·tanh(z / c)``.
    """

    weight: torch.Tensor  # (V, H)
    bias: torch.Tensor | None = None  # (V,)
    softcap: float | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    def detached(self) -> LMHead:
        """The same head with no gradient path (e.g. for a no-grad teacher)."""
        b = None if self.bias is None else self.bias.detach()
        return LMHead(self.weight.detach(), b, self.softcap)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full logits (reference path / tests only)."""
        z = torch.nn.functional.linear(hidden, self.weight, self.bias)
        if z.dtype in (torch.float16, torch.bfloat16):
            z = z.float()
        return z if self.softcap is None else self.softcap * torch.tanh(z / self.softcap)


def _lin(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    z = h @ w.t()
    if b is not None:
        z = z + b
    return z.float() if z.dtype in (torch.float16, torch.bfloat16) else z


def _cap(z: torch.Tensor, softcap: float | None) -> torch.Tensor:
    return z if softcap is None else softcap * torch.tanh(z / softcap)


class _FusedRows(torch.autograd.Function):
    """Streams: (hidden_N H, weight V H, bias) for the student and optionally the teacher."""

    @staticmethod
    def forward(ctx, row_fn, valid_idx, weights, chunk, caps, n_streams, n_extra, *tensors):
        if tensors[0].device.type == "cpu":
            pin_mmap_threshold()  # freed tiles would otherwise stay resident (see allocator.py)
        streams = [tensors[3 * i : 3 * i + 3] for i in range(n_streams)]
        extras = tensors[3 * n_streams : 3 * n_streams + n_extra]
        needs = [bool(x) for x in ctx.needs_input_grad[7 : 7 + 3 * n_streams]]
        ctx.meta = (row_fn, chunk, caps, n_streams, n_extra)
        ctx.scalar = weights is not None
        grads = _new_grads(streams, needs)
        ref = streams[0][0]
        out_dtype = torch.promote_types(ref.dtype, torch.float32)
        n_valid = valid_idx.numel()
        want = any(needs)
        if weights is None:
            losses = torch.empty(n_valid, dtype=out_dtype, device=ref.device)
            with torch.no_grad():
                for a in range(0, n_valid, chunk):
                    idx = valid_idx[a : a + chunk]
                    lins = _project([h.index_select(0, idx) for h, _, _ in streams], streams)
                    zs = [_cap(z, c) for z, c in zip(lins, caps)]
                    losses[a : a + chunk] = row_fn(*zs, *(e.index_select(0, idx) for e in extras))
            ctx.save_for_backward(valid_idx, *tensors)
            ctx.needs = needs
            return losses
        total = torch.zeros((), dtype=out_dtype, device=ref.device)
        for a in range(0, n_valid, chunk):
            idx = valid_idx[a : a + chunk]
            total += _chunk_step(
                row_fn, streams, extras, caps, idx, weights[a : a + chunk], needs, grads, want
            )
        ctx.grads = grads
        ctx.dtypes = [None if x is None else x.dtype for x in tensors[: 3 * n_streams]]
        return total

    @staticmethod
    def backward(ctx, grad_out):
        row_fn, chunk, caps, n_streams, n_extra = ctx.meta
        head = (None,) * 7
        if ctx.scalar:
            if ctx.grads is None:
                raise RuntimeError(
                    "a fused loss can be backpropagated once (its gradient is consumed in place)"
                )
            res = [None if g is None else g.mul_(grad_out).to(dt) for g, dt in zip(ctx.grads, ctx.dtypes)]
            ctx.grads = None
            return (*head, *res, *(None,) * n_extra)
        valid_idx, *tensors = ctx.saved_tensors
        streams = [tensors[3 * i : 3 * i + 3] for i in range(n_streams)]
        extras = tensors[3 * n_streams :]
        grads = _new_grads(streams, ctx.needs)
        for a in range(0, valid_idx.numel(), chunk):
            idx = valid_idx[a : a + chunk]
            _chunk_step(row_fn, streams, extras, caps, idx, grad_out[a : a + chunk], ctx.needs, grads, True)
        flat = [x for s in streams for x in s]
        res = [None if g is None else g.to(x.dtype) for g, x in zip(grads, flat)]
        return (*head, *res, *(None,) * n_extra)


def _new_grads(streams, needs):
    flat = [x for s in streams for x in s]
    return [
        torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        if (x is not None and nd)
        else None
        for x, nd in zip(flat, needs)
    ]


def _same_head(streams) -> bool:
    """All streams project with the same weight/bias storage (student and a detached teacher)."""
    (_, w0, b0), rest = streams[0], streams[1:]
    return all(
        w.data_ptr() == w0.data_ptr()
        and w.shape == w0.shape
        and w.stride() == w0.stride()
        and (b is None) == (b0 is None)
        and (b is None or b.data_ptr() == b0.data_ptr())
        for _, w, b in rest
    )


def _project(hs, streams):
    """Each stream's (chunk, V) logits; one GEMM over the stacked rows when the heads are one head."""
    with torch.no_grad():
        if len(streams) > 1 and _same_head(streams) and len({h.dtype for h in hs}) == 1:
            _, wt, b = streams[0]
            return list(_lin(torch.cat(hs), wt, b).split([h.shape[0] for h in hs]))
        return [_lin(h, wt, b) for h, (_, wt, b) in zip(hs, streams)]


def _fold(g, h, wt, idx, g_h, g_w, g_b) -> None:
    """Fold a chunk's logits gradient into the hidden, weight and bias gradients, in place."""
    if g_h is not None:
        g_h.index_add_(0, idx, (g.to(wt.dtype) @ wt).to(g_h.dtype))
    if g_w is not None:
        g_w.addmm_(g.t().to(g_w.dtype), h.to(g_w.dtype))
    if g_b is not None:
        g_b += g.sum(0).to(g_b.dtype)


def _chunk_step(row_fn, streams, extras, caps, idx, w, needs, grads, want):
    """One chunk: loss value Σ w·ℓ and (if ``want``) gradients folded into ``grads`` in place."""
    hs = [h.index_select(0, idx) for h, _, _ in streams]
    lins = _project(hs, streams)
    stream_needs = [any(needs[3 * i : 3 * i + 3]) for i in range(len(streams))]
    analytic = getattr(row_fn, "analytic", None)
    if analytic is not None and want and not any(stream_needs[1:]) and all(c is None for c in caps):
        # Closed-form value and gradient (kernels.analytic), in place on the tile; None -> autograd.
        out = analytic(*lins, *(e.index_select(0, idx) for e in extras), w)
        if out is not None:
            per, g = out
            if stream_needs[0]:
                _fold(g, hs[0], streams[0][1], idx, *grads[0:3])
            return (per * w.to(per.dtype)).sum()
    leaves = [z.requires_grad_(nd and want) for z, nd in zip(lins, stream_needs)]
    with torch.enable_grad() if want else torch.no_grad():
        zs = [_cap(z, c) for z, c in zip(leaves, caps)]
        val = (row_fn(*zs, *(e.index_select(0, idx) for e in extras)) * w.to(zs[0].dtype)).sum()
    wrt = [z for z, nd in zip(leaves, stream_needs) if nd]
    if not (want and wrt):
        return val.detach()
    g_lins = iter(torch.autograd.grad(val, wrt, allow_unused=True))
    for i, (h, (_, wt, _b)) in enumerate(zip(hs, streams)):
        if not stream_needs[i]:
            continue
        g = next(g_lins)
        if g is None:
            continue
        _fold(g, h, wt, idx, *grads[3 * i : 3 * i + 3])
    return val.detach()


def fused_rows(
    row_fn: Callable[..., torch.Tensor],
    heads_and_hidden: list[tuple[torch.Tensor, LMHead]],
    extras: Sequence[torch.Tensor] = (),
    *,
    valid_idx: torch.Tensor,
    weights: torch.Tensor | None,
    chunk_rows: int,
) -> torch.Tensor:
    """Run ``row_fn(*logits_chunks, *extra_chunks)`` over chunks of hidden rows (N, H).

    Returns Σ weights·ℓ (scalar) when ``weights`` is given, else the (n_valid,) per-row losses.
    """
    flat, caps = [], []
    for hidden, head in heads_and_hidden:
        flat += [hidden, head.weight, head.bias]
        caps.append(head.softcap)
    return _FusedRows.apply(
        row_fn,
        valid_idx,
        weights,
        int(chunk_rows),
        tuple(caps),
        len(heads_and_hidden),
        len(extras),
        *flat,
        *extras,
    )


def reduce_fused(
    row_fn: Callable[..., torch.Tensor],
    pairs: list[tuple[torch.Tensor, LMHead]],
    extras: list[torch.Tensor],
    mask_N: torch.Tensor,
    denom: torch.Tensor | float | None,
    out_shape: tuple[int, ...],
    chunk_rows: int | None,
) -> torch.Tensor:
    """`kernels.chunked.masked_reduce` on the fused engine (``pairs``: (hidden rows, head) per stream)."""
    dtype = torch.promote_types(pairs[0][0].dtype, torch.float32)
    chunk = chunk_rows or default_fused_chunk_rows(pairs[0][1].vocab_size)

    def run(valid_idx: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        return fused_rows(row_fn, pairs, extras, valid_idx=valid_idx, weights=weights, chunk_rows=chunk)

    return masked_reduce(run, mask_N, denom, out_shape, dtype)


@dataclass(frozen=True)
class HiddenPair:
    """The two hidden streams of a two-stream loss, flattened to rows: ``student`` (N, H), ``teacher``
    (N, H'), and ``lead``, the (B, T) they came from (the shape of per-token outputs)."""

    lead: tuple[int, ...]
    student: torch.Tensor
    teacher: torch.Tensor

    def reduce(
        self,
        row_fn: Callable[..., torch.Tensor],
        head: LMHead,
        teacher_head: LMHead | None,
        *,
        mask_N: torch.Tensor,
        denom: torch.Tensor | float | None,
        chunk_rows: int | None = None,
    ) -> torch.Tensor:
        """`reduce_fused` of ``row_fn(student_logits, teacher_logits)`` over the two streams.

        ``teacher_head=None`` projects the teacher with ``head.detached()``: it sends no gradient into the
        head, as in SDPO where the teacher is a no-grad forward of the same model.
        """
        pairs = [(self.student, head), (self.teacher, teacher_head or head.detached())]
        return reduce_fused(row_fn, pairs, [], mask_N, denom, self.lead, chunk_rows)


def hidden_pair(student_hidden: torch.Tensor, teacher_hidden: torch.Tensor) -> HiddenPair:
    """The `HiddenPair` of a two-stream loss's hidden states; checks their dtype and (B, T)."""
    for name, x in (("student_hidden", student_hidden), ("teacher_hidden", teacher_hidden)):
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point hidden states")
    if student_hidden.shape[:-1] != teacher_hidden.shape[:-1]:
        raise ValueError(
            f"student_hidden {tuple(student_hidden.shape)} and teacher_hidden "
            f"{tuple(teacher_hidden.shape)} must share the leading (B, T) dimensions"
        )
    lead = tuple(student_hidden.shape[:-1])
    N = math.prod(lead)
    return HiddenPair(lead, student_hidden.reshape(N, -1), teacher_hidden.reshape(N, -1))
