"""Fused LM-head + loss: large-vocabulary losses from hidden states, never building (B, T, V) logits.

Input is the final hidden states (B, T, H) and the LM-head weight (V, H) (+ optional bias, optional
final-logit soft-capping). Tokens are processed in chunks: project one chunk to (chunk, V) logits,
compute the per-token loss with the same row functions as the reference path
(`kernels.chunked`), and, in the same pass, the gradient with respect to the chunk's logits, which is
immediately folded into ``grad_hidden`` (a (chunk, H) matmul) and accumulated **in place** into
``grad_weight`` (``addmm_``), so no (V, H) temporary is created per chunk. Only one chunk of logits
ever exists (Liger-Kernel's fused-linear scheme, in plain PyTorch; see docs/large_vocab.md).

For a reduced (scalar) loss backward only scales the stored gradients; for per-token outputs
(``reduction="none"``, token log-probs) backward recomputes each chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from composer_replication.kernels.allocator import pin_mmap_threshold
from composer_replication.kernels.analytic import ce_value_grad, logprob_value_grad
from composer_replication.kernels.plans import eopd_plan, gjsd_plan, gjsd_row_fn, taid_plan
from composer_replication.kernels.rows import ce_rows, eopd_rows, logprob_rows, taid_rows

__all__ = [
    "LMHead",
    "default_fused_chunk_rows",
    "fused_rows",
    "fused_generalized_jsd_loss",
    "fused_taid_loss",
    "fused_entropy_aware_opd_loss",
    "fused_token_logprobs",
    "fused_cross_entropy",
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
    extras: list[torch.Tensor] = (),
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


def _reduce(row_fn, pairs, extras, mask_N, denom, out_shape, chunk_rows):
    dtype = torch.promote_types(pairs[0][0].dtype, torch.float32)
    valid_idx = mask_N.nonzero().squeeze(-1)
    mvals = mask_N.index_select(0, valid_idx).to(dtype)
    chunk = chunk_rows or default_fused_chunk_rows(pairs[0][1].vocab_size)
    if denom is None:
        per = fused_rows(row_fn, pairs, extras, valid_idx=valid_idx, weights=None, chunk_rows=chunk)
        out = torch.zeros(mask_N.shape[0], dtype=per.dtype, device=per.device)
        return out.index_put((valid_idx,), per * mvals).view(out_shape)
    return fused_rows(row_fn, pairs, extras, valid_idx=valid_idx, weights=mvals / denom, chunk_rows=chunk)


def _flat2(student_hidden, teacher_hidden):
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
    return lead, N, student_hidden.reshape(N, -1), teacher_hidden.reshape(N, -1)


def fused_generalized_jsd_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    head: LMHead,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    top_k: int | None = None,
    token_clip: float | None = None,
    *,
    num_items_in_batch: int | torch.Tensor | None = None,
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``opsd.generalized_jsd_loss(head(student_hidden), teacher_head(teacher_hidden), ...)``.

    Same values and gradients, without the (B, T, V) logits. ``teacher_head=None`` uses
    ``head.detached()``: the teacher sends no gradient into the head, as in SDPO where teacher
    logits come from a no-grad forward of the same model.
    """
    from composer_replication.opsd import _check_gjsd_params

    V = head.vocab_size
    _check_gjsd_params(beta, temperature, reduction, top_k, token_clip, V)
    lead, N, hs, ht = _flat2(student_hidden, teacher_hidden)
    keep, denom = gjsd_plan(lead, V, labels, reduction, top_k, num_items_in_batch, hs.device)
    fn = gjsd_row_fn(beta, temperature, False, top_k, token_clip)
    pairs = [(hs, head), (ht, teacher_head or head.detached())]
    return _reduce(fn, pairs, [], keep, denom, lead, chunk_rows)


def fused_taid_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    head: LMHead,
    mask: torch.Tensor | None = None,
    *,
    t: float | torch.Tensor,
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`distillation.taid_loss` on hidden states (teacher head detached unless given)."""
    from composer_replication.distillation.taid import _check_t

    _check_t(t)
    lead, N, hs, ht = _flat2(student_hidden, teacher_hidden)
    w, denom = taid_plan(mask, lead, torch.promote_types(hs.dtype, torch.float32), hs.device)
    tv = float(t)
    pairs = [(hs, head), (ht, teacher_head or head.detached())]
    return _reduce(lambda zs, zt: taid_rows(zs, zt, t=tv), pairs, [], w, denom, lead, chunk_rows)


def fused_entropy_aware_opd_loss(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    head: LMHead,
    *,
    labels: torch.Tensor | None = None,
    h_max: float | None = None,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`distillation.entropy_aware_opd_loss` on hidden states (teacher head detached unless given)."""
    lead, N, hs, ht = _flat2(student_hidden, teacher_hidden)
    keep, denom, hm = eopd_plan(labels, lead, head.vocab_size, reduction, h_max, temperature, hs.device)

    def fn(zs, zt):
        return eopd_rows(zs, zt, h_max=hm, temperature=temperature)

    pairs = [(hs, head), (ht, teacher_head or head.detached())]
    return _reduce(fn, pairs, [], keep, denom, lead, chunk_rows)


def fused_token_logprobs(
    hidden_BTH: torch.Tensor, head: LMHead, labels_BT: torch.Tensor, *, chunk_rows: int | None = None
) -> torch.Tensor:
    """(B, T) log p(label) from hidden states; ``-100`` labels give 0."""
    lead = tuple(hidden_BTH.shape[:-1])
    N = math.prod(lead)
    lab = labels_BT.reshape(N)
    valid = lab != -100
    safe = torch.where(valid, lab, torch.zeros_like(lab))
    pairs = [(hidden_BTH.reshape(N, -1), head)]

    def fn(z, y):
        return logprob_rows(z, y)

    fn.analytic = logprob_value_grad
    return _reduce(fn, pairs, [safe], valid, None, lead, chunk_rows)


def fused_cross_entropy(
    hidden_NH: torch.Tensor,
    head: LMHead,
    labels_N: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(head(hidden), labels, label_smoothing=)`` (mean over non-ignored tokens)."""
    H = hidden_NH.shape[-1]
    lab = labels_N.reshape(-1)
    valid = lab != ignore_index
    safe = torch.where(valid, lab, torch.zeros_like(lab))

    def fn(z, y):
        return ce_rows(z, y, label_smoothing=label_smoothing)

    fn.analytic = lambda z, y, w: ce_value_grad(z, y, w, label_smoothing=label_smoothing)

    pairs = [(hidden_NH.reshape(-1, H), head)]
    return _reduce(fn, pairs, [safe], valid, valid.sum(), (), chunk_rows)
