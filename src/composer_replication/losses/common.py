"""What the distillation families share: KL from log-probs, reductions, input checks, engine names.

Every family (`losses.gjsd`, `losses.taid`, `losses.eopd`, `losses.ce`) reduces a per-token loss the
same way and checks its tensors the same way; this module holds those pieces once. Pure functions,
torch only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "ENGINES",
    "REDUCTIONS",
    "check_engine",
    "check_labels",
    "check_pair",
    "check_reduction",
    "entropy",
    "kl",
    "per_token_output",
    "reduce_per_token",
    "reduction_denominator",
    "reference_reduce",
    "row_plan",
]

REDUCTIONS = ("batchmean", "sum", "mean", "none")
# full: the reference on (B, T, V) logits; chunked: the same logits over token chunks
# (kernels.chunked); fused: hidden states + LM head, the logits never exist (kernels.fused_linear).
ENGINES = ("full", "chunked", "fused")


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(p || q) summed over the last axis, from log-probabilities; 0·log 0 terms are exactly 0."""
    p = logp.exp()
    # where() keeps p = 0 entries (logp = -inf) from turning into 0 * inf = nan, in value and gradient.
    diff = torch.where(p > 0, logp - logq, torch.zeros_like(logp))
    return (p * diff).sum(-1)


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last axis, from log-probabilities (0 at p = 0)."""
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(logp)).sum(-1)


def reduction_denominator(
    reduction: str, n_valid: int, support: int, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor | float | None:
    """The divisor of ``Σ d_i`` over the ``n_valid`` kept tokens (None = per-token output, ``"none"``).

    ``batchmean`` = per kept token (0 kept tokens divide by 1), ``sum`` = 1, ``mean`` = per element
    (``n_valid · support``); ``num_items_in_batch`` overrides the reduction (global-token normalisation).
    """
    if num_items_in_batch is not None:
        return num_items_in_batch
    if reduction == "batchmean":
        return float(max(n_valid, 1))
    if reduction == "sum":
        return 1.0
    if reduction == "mean":
        return float(max(n_valid * support, 1))
    return None


def reduce_per_token(
    per_token: torch.Tensor,
    n_valid: int,
    support: int,
    reduction: str,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """``Σ d_i / reduction_denominator(...)`` of the ``n_valid`` kept tokens' per-token values."""
    denom = reduction_denominator(reduction, n_valid, support, num_items_in_batch)
    if denom is None:
        raise ValueError(f"reduction={reduction!r} does not reduce; use one of {REDUCTIONS[:3]}")
    total = per_token.sum()
    return total if reduction == "sum" and num_items_in_batch is None else total / denom


def per_token_output(per_token: torch.Tensor, keep: torch.Tensor | None, lead: torch.Size) -> torch.Tensor:
    """``reduction="none"``: the kept tokens' values back in the ``(B, T)`` layout, 0 elsewhere."""
    if keep is None:
        return per_token
    return per_token.new_zeros(lead).masked_scatter(keep, per_token)


def reference_reduce(
    rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    student: torch.Tensor,
    teacher: torch.Tensor,
    keep: torch.Tensor | None,
    reduction: str,
    support: int,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """A reference engine's per-token pair loss, reduced: ``rows`` sees only the kept ``(N, V)`` rows
    (``keep`` is the (B, T) mask, None keeps all), so dropped positions never enter the computation;
    ``"none"`` gives the (B, T) values (0 where dropped), any other reduction :func:`reduce_per_token`."""
    s, t = (student, teacher) if keep is None else (student[keep], teacher[keep])
    per_token = rows(s, t)
    if reduction == "none" and num_items_in_batch is None:
        return per_token_output(per_token, keep, student.shape[:-1])
    n_valid = int(keep.sum()) if keep is not None else per_token.numel()
    return reduce_per_token(per_token, n_valid, support, reduction, num_items_in_batch)


def row_plan(
    keep: torch.Tensor | None,
    lead: Sequence[int],
    reduction: str,
    support: int,
    num_items_in_batch: int | torch.Tensor | None = None,
    *,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | float | None]:
    """(keep mask over the N rows, divisor) for a chunked or fused engine, reducing as the reference
    does: ``keep`` is the (B, T) mask of kept tokens (None keeps all), the divisor
    :func:`reduction_denominator`'s."""
    N = math.prod(lead)
    if keep is None:
        keep_N, n_valid = torch.ones(N, dtype=torch.bool, device=device), N
    else:
        keep_N = keep.reshape(N)
        n_valid = int(keep_N.sum())
    return keep_N, reduction_denominator(reduction, n_valid, support, num_items_in_batch)


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is unknown; use one of {REDUCTIONS}")


def check_pair(
    student: torch.Tensor,
    teacher: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    labels_name: str = "labels",
) -> None:
    """The reference losses' tensor checks: floating-point logits of one shape, labels of their (B, T)."""
    for name, x in (("student_logits", student), ("teacher_logits", teacher)):
        if not torch.is_floating_point(x):
            raise ValueError(f"{name} has dtype {x.dtype}; pass floating-point logits (e.g. logits.float())")
    if student.shape != teacher.shape:
        raise ValueError(
            f"student_logits {tuple(student.shape)} and teacher_logits {tuple(teacher.shape)} "
            "must have the same (B, T, V) shape; slice both to the same completion positions"
        )
    check_labels(labels, tuple(student.shape[:-1]), labels_name)


def check_labels(labels: torch.Tensor | None, lead: tuple[int, ...], name: str = "labels") -> None:
    """``labels`` (or a mask) is None or has the per-token loss's ``(B, T)`` shape ``lead``."""
    if labels is not None and tuple(labels.shape) != tuple(lead):
        raise ValueError(
            f"{name} {tuple(labels.shape)} must match the logits' leading (B, T) shape {tuple(lead)}"
        )


def check_engine(engine: str, head: object | None) -> None:
    """``engine`` is one of :data:`ENGINES`, and ``head`` is given exactly when it is ``"fused"``."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is unknown; use one of {ENGINES}")
    if engine == "fused" and head is None:
        raise ValueError(
            "engine='fused' takes hidden states and needs head= (an LMHead, e.g. kernels.hf.lm_head_of(model))"
        )
    if engine != "fused" and head is not None:
        raise ValueError(f"head= is only used by engine='fused' (got engine={engine!r} with logits)")
