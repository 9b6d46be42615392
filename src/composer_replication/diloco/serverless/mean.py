"""The float64 fixed-order mean every replica computes identically, and its one per-slice kernel.

Each element of the mean is ``(((0 + w_0·x_0) + w_1·x_1) + ...) / Σw``, accumulated in float64 in
ascending rank order and rounded once to the tensors' dtype. Same bytes in, same order, same
operations: every replica gets the same bits. The work runs over slices that stay in cache; the
slicing, the threads and the two shortcuts below change the speed, never the bits, because every
element is computed alone by the same operations whichever slice or thread holds it:

- a weight of exactly 1.0 widens the slice to float64 first (exact) and adds float64 to float64,
  the same rounding as the mixed-dtype add;
- when ``1 / Σw`` is exact (Σw a power of two: 2, 4, 8 equal replicas) the division is a
  multiplication by it, which rounds the same exact quotient once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["fixed_order_mean", "SliceMean", "SLICE", "upload_weight"]

SLICE = 1 << 16  # elements per accumulation slice (a multiple of every SIMD width)
_BLOCK = 1 << 20  # elements per unit of work handed to a thread (a multiple of SLICE)


def upload_weight(meta: Mapping[str, str]) -> float | None:
    """An upload's ``weight`` metadata (default 1.0) if it is a finite positive number, else None.

    One bad weight would turn every replica's mean into NaN or inf, so it rejects the upload.
    """
    try:
        value = float(meta.get("weight", "1.0"))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


class SliceMean:
    """``out[:] = Σ_r w_r·src_r / Σw`` over one slice at a time, with reused float64 buffers (one per thread)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.w = [float(x) for x in weights]
        self.total = sum(self.w)
        self.inv = 1.0 / self.total if math.frexp(self.total)[0] == 0.5 else None
        self.acc = torch.empty(SLICE, dtype=torch.float64)
        self.tmp = torch.empty(SLICE, dtype=torch.float64)

    def __call__(
        self, out: torch.Tensor, sources: Sequence[torch.Tensor], *, check_finite: bool = False
    ) -> bool:
        """``out`` and each source: 1-D, the same length, at most :data:`SLICE`; sources in rank order.

        With ``check_finite``, returns whether every source was finite in this slice: a NaN or inf
        in any source leaves a NaN or inf in the float64 sum (finite float32 values cannot overflow it).
        """
        n = out.numel()
        acc = self.acc[:n].zero_()
        for weight, src in zip(self.w, sources):
            if weight == 1.0:
                acc.add_(self.tmp[:n].copy_(src))
            else:  # in-place mixed-dtype add: computed in float64
                acc.add_(src, alpha=weight)
        finite = not check_finite or math.isfinite(float(acc.sum()))
        out.copy_(acc.mul_(self.inv) if self.inv is not None else acc.div_(self.total))
        return finite


def fixed_order_mean(
    contributions: Mapping[int, Mapping[str, torch.Tensor]],
    weights: Mapping[int, float] | None = None,
    *,
    threads: int = 2,
) -> dict[str, torch.Tensor]:
    """Weighted mean of per-rank tensor dicts, in ascending rank order, accumulated in float64.

    Pure and deterministic: the reference that every replica (and the single-process simulation)
    computes identically. The result has each tensor's original dtype; the work is split between
    ``threads`` threads.
    """
    ranks = sorted(contributions)
    if not ranks:
        raise ValueError("fixed_order_mean needs at least one contribution")
    w = [float(weights[r]) if weights else 1.0 for r in ranks]
    first = contributions[ranks[0]]
    out: dict[str, torch.Tensor] = {}
    blocks = []  # (sources, output, lo, hi): independent pieces of work
    for name in sorted(first):
        ref = first[name]
        sources = [contributions[r][name].reshape(-1) for r in ranks]
        flat = torch.empty(ref.numel(), dtype=ref.dtype)
        out[name] = flat.view(ref.shape)
        for lo in range(0, ref.numel(), _BLOCK):
            blocks.append((sources, flat, lo, min(lo + _BLOCK, ref.numel())))

    def run(mine: list[tuple[list[torch.Tensor], torch.Tensor, int, int]]) -> None:
        mean = SliceMean(w)
        for sources, flat, lo, hi in mine:
            for c in range(lo, hi, SLICE):
                d = min(c + SLICE, hi)
                mean(flat[c:d], [src[c:d] for src in sources])

    threads = max(1, min(threads, len(blocks)))
    if threads == 1:
        run(blocks)
    else:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="allreduce-mean") as pool:
            list(pool.map(run, [blocks[i::threads] for i in range(threads)]))
    return out
