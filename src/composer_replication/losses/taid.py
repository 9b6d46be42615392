"""TAID: Temporally Adaptive Interpolated Distillation, on every engine, and its adaptive ``t`` schedule.

Paper: Shing, Misaki, Bao, Yokoi, Akiba, "TAID: Temporally Adaptive Interpolated Distillation for
Efficient Knowledge Transfer in Language Models" (ICLR 2025, arXiv 2501.16937). Port of SakanaAI/TAID
``src/distil_losses/taid.py`` (``TAID.compute_loss`` and ``TAID.update_t``).

Loss, per token, with the student's own logits as the (detached) anchor::

    p_t = softmax( (1 - t) · stop_grad(z_S) + t · z_T )
    l   = - Σ_v p_t(v) · log_softmax(z_S)(v)          (vocabulary entries where z_S = ±inf count 0)
    L   = Σ_i l_i · mask_i / Σ_i mask_i

At t = 0 the target is the detached student, so the teacher sends no signal; at t = 1 it is
forward-KL distillation to the teacher (the loss differs from KL(p_T‖q) by the teacher entropy).
Shapes: ``student_logits_BTV``, ``teacher_logits_BTV`` are ``(B, T, V)``; ``mask_BT`` is ``(B, T)``;
hidden states ``(B, T, H)``.

The family: :func:`check_args`, the row function :func:`taid_rows`, the chunk :func:`plan`, the
reference :func:`taid_loss` and its chunked and fused-linear twins, :func:`loss` (``engine=``), and
:class:`TAIDScheduler`, which drives ``t`` with the upstream adaptive rule (see its docstring).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from composer_replication.kernels.chunked import reduce_pair
from composer_replication.kernels.fused_linear import LMHead, hidden_pair
from composer_replication.losses.common import check_engine, check_labels, check_pair

__all__ = [
    "TAIDScheduler",
    "check_args",
    "chunked_taid_loss",
    "fused_taid_loss",
    "loss",
    "plan",
    "taid_loss",
    "taid_rows",
]


def check_args(t: float | torch.Tensor) -> None:
    """``t`` is a scalar (float or one-element tensor) in [0, 1]."""
    if isinstance(t, torch.Tensor):
        if t.numel() != 1:
            raise ValueError(f"t must be a scalar in [0, 1]; got a tensor of shape {tuple(t.shape)}")
        value = float(t.detach())
    else:
        value = float(t)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"t={value} must be in [0, 1] (drive it from TAIDScheduler.t or pass a fixed value)")


def taid_rows(s_nV: torch.Tensor, t_nV: torch.Tensor, *, t: float | torch.Tensor) -> torch.Tensor:
    """Per-row cross-entropy −Σ_v p_t(v)·log q(v), p_t = softmax((1−t)·sg(z_S) + t·z_T), in at least fp32.

    Vocabulary entries where the student logit is ±inf contribute 0 (SakanaAI/TAID).
    """
    dtype = torch.promote_types(s_nV.dtype, torch.float32)
    z_s, z_t = s_nV.to(dtype), t_nV.to(dtype)
    p_t = torch.softmax((1 - t) * z_s.detach() + t * z_t, dim=-1)
    logq = torch.log_softmax(z_s, dim=-1)
    prod = torch.where(torch.isinf(z_s), torch.zeros_like(logq), p_t * logq)
    return -prod.sum(-1)


def plan(mask: torch.Tensor | None, lead, dtype, device):
    """(per-row weights, divisor): TAID's masked token mean Σ(ℓ·mask)/Σmask (None ⇒ mean over all)."""
    N = math.prod(lead)
    if mask is None:
        return torch.ones(N, dtype=dtype, device=device), float(max(N, 1))
    w = mask.reshape(N).to(dtype)
    return w, w.sum().clamp_min(1)


def taid_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    t: float | torch.Tensor,
) -> torch.Tensor:
    """Masked-token-mean TAID loss (0 with a gradient when the mask is empty): the reference engine.

    Computed in at least float32, as upstream. Gradients reach ``teacher_logits`` through ``p_t`` if
    it requires grad (in SDPO the teacher forward runs under ``no_grad``).

    Raises:
        ValueError: shape mismatch, integer logits, or ``t`` outside [0, 1].
    """
    check_pair(student_logits, teacher_logits, mask, labels_name="mask")
    check_args(t)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    if isinstance(t, torch.Tensor):
        t = t.to(device=student_logits.device, dtype=dtype)
    per_token = taid_rows(student_logits, teacher_logits, t=t)
    if mask is None:
        return per_token.sum() / max(per_token.numel(), 1)
    w = mask.to(dtype)
    return (per_token * w).sum() / w.sum().clamp_min(1)


def chunked_taid_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    t: float | torch.Tensor,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """:func:`taid_loss` over token chunks (same values and gradients)."""
    check_pair(student_logits, teacher_logits, mask, labels_name="mask")
    check_args(t)
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    w, denom = plan(mask, tuple(student_logits.shape[:-1]), dtype, student_logits.device)
    fn = functools.partial(taid_rows, t=float(t))
    return reduce_pair(fn, student_logits, teacher_logits, mask_N=w, denom=denom, chunk_rows=chunk_rows)


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
    """:func:`taid_loss` on hidden states + LM head (teacher head detached unless given)."""
    check_args(t)
    pair = hidden_pair(student_hidden, teacher_hidden)
    check_labels(mask, pair.lead, "mask")
    dtype = torch.promote_types(pair.student.dtype, torch.float32)
    w, denom = plan(mask, pair.lead, dtype, pair.student.device)
    fn = functools.partial(taid_rows, t=float(t))
    return pair.reduce(fn, head, teacher_head, mask_N=w, denom=denom, chunk_rows=chunk_rows)


def loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    t: float | torch.Tensor,
    engine: str = "full",
    head: LMHead | None = None,
    teacher_head: LMHead | None = None,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """TAID on the chosen engine: ``"full"`` / ``"chunked"`` on ``(B, T, V)`` logits, ``"fused"`` on
    ``(B, T, H)`` hidden states with ``head`` (``teacher_head`` defaults to ``head.detached()``)."""
    check_engine(engine, head)
    if engine == "full":
        return taid_loss(student, teacher, mask, t=t)
    if engine == "chunked":
        return chunked_taid_loss(student, teacher, mask, t=t, chunk_rows=chunk_rows)
    assert head is not None  # check_engine: fused has a head
    return fused_taid_loss(
        student, teacher, head, mask, t=t, teacher_head=teacher_head, chunk_rows=chunk_rows
    )


class TAIDScheduler:
    """The upstream adaptive schedule for ``t`` (``TAID.update_t``), device-agnostic and resumable.

    Each :meth:`update_t` call with the detached loss ``J_n`` at ``global_step``:

    - the first call with a finite loss only stores ``prev_loss = J_n`` and returns None;
    - a non-finite loss (nan/inf) is skipped: state unchanged, returns None (upstream would poison
      the momentum with nan);
    - otherwise ``δ = (prev_loss - J_n) / (prev_loss + 1e-15)``; ``m = β·m + (1-β)·δ``;
      ``t_lin = t_start + (t_end - t_start)·global_step/num_train_steps``;
      ``Δt = α·sigmoid(m)·(1 - t)``; ``t = min(t_end, max(t_lin, t + Δt))`` (``min(t_end, t_lin)`` with
      ``disable_adaptive``); ``prev_loss = J_n``; returns ``Δt`` as a 0-d tensor.

    ``t`` is therefore monotone non-decreasing, never below the linear floor and never above ``t_end``.
    State is kept in Python floats (float64), so the schedule is identical on every device; ``device``
    only places the returned ``Δt``. :meth:`state_dict` / :meth:`load_state_dict` round-trip it.
    """

    def __init__(
        self,
        num_train_steps: int,
        *,
        t_start: float = 0.4,
        t_end: float = 1.0,
        alpha: float = 5e-4,
        beta: float = 0.99,
        disable_adaptive: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        if int(num_train_steps) < 1:
            raise ValueError(f"num_train_steps={num_train_steps} must be >= 1 (the planned optimizer steps)")
        if not 0.0 <= t_start < 1.0:
            raise ValueError(f"t_start={t_start} must be in [0, 1)")
        if not 0.0 < t_end <= 1.0 or t_end < t_start:
            raise ValueError(f"t_end={t_end} must be in (0, 1] and >= t_start={t_start}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha} must be in [0, 1]")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta={beta} must be in [0, 1)")
        self.num_train_steps = int(num_train_steps)
        self.t_start, self.t_end, self.alpha, self.beta = (
            float(t_start),
            float(t_end),
            float(alpha),
            float(beta),
        )
        self.disable_adaptive = bool(disable_adaptive)
        self.device = torch.device(device)
        self._t = self.t_start
        self.prev_loss = math.inf
        self.momentum = 0.0

    @property
    def t(self) -> float:
        """The current interpolation coefficient."""
        return self._t

    def update_t(self, loss: float | torch.Tensor, global_step: int) -> torch.Tensor | None:
        """Advance the schedule with this step's loss; see the class docstring."""
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        if not math.isfinite(value):
            return None
        if math.isinf(self.prev_loss):
            self.prev_loss = value
            return None
        rel = (self.prev_loss - value) / (self.prev_loss + 1e-15)
        self.momentum = self.beta * self.momentum + (1 - self.beta) * rel
        t_lin = self.t_start + (self.t_end - self.t_start) * (global_step / self.num_train_steps)
        delta = self.alpha * (1.0 / (1.0 + math.exp(-self.momentum))) * (1 - self._t)
        if self.disable_adaptive:
            self._t = min(self.t_end, t_lin)
        else:
            self._t = min(self.t_end, max(t_lin, self._t + delta))
        self.prev_loss = value
        return torch.tensor(delta, dtype=torch.float32, device=self.device)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: the config and the three state values."""
        return {
            "num_train_steps": self.num_train_steps,
            "t_start": self.t_start,
            "t_end": self.t_end,
            "alpha": self.alpha,
            "beta": self.beta,
            "disable_adaptive": self.disable_adaptive,
            "t": self._t,
            "prev_loss": self.prev_loss,
            "momentum": self.momentum,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (config included, so a resumed run follows the same schedule)."""
        missing = {"t", "prev_loss", "momentum"} - set(state)
        if missing:
            raise ValueError(
                f"TAIDScheduler state is missing {sorted(missing)}; pass a dict from state_dict()"
            )
        for key in ("num_train_steps", "t_start", "t_end", "alpha", "beta", "disable_adaptive"):
            if key in state:
                setattr(self, key, type(getattr(self, key))(state[key]))
        self._t = float(state["t"])
        self.prev_loss = float(state["prev_loss"])
        self.momentum = float(state["momentum"])

    def __repr__(self) -> str:
        return f"TAIDScheduler(t={self._t:.6f}, momentum={self.momentum:.3g}, num_train_steps={self.num_train_steps})"
