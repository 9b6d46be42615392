"""Optional GPU kernels for the fused-linear generalized JSD: TRL's Triton tiles and Liger-Kernel.

What is covered: ``backend="trl"`` runs TRL 1.16's ``ChunkedDivergenceFunction`` (Triton kernels on
CUDA, online log-sum-exp over (4096 × 32768) tiles); ``backend="liger"`` runs Liger-Kernel's
``LigerFusedLinearJSDLoss`` (soft loss only). Both reduce to the mean over kept tokens, i.e.
``fused_generalized_jsd_loss(..., reduction="batchmean")``, and are checked against that torch path
by ``tests/kernels/test_gpu_kernels.py`` (marked ``gpu``).

What is not covered: ``top_k``, ``token_clip`` and ``logits_are_probs`` (neither kernel has them;
use the torch path), TAID and entropy-aware OPD, and any CPU execution of Liger (its Triton kernels
need CUDA; TRL's kernel falls back to torch tiles on CPU, which is what the CPU benchmark measures).
"""

from __future__ import annotations

import torch

from composer_replication._extras import is_available, require
from composer_replication.kernels.fused_linear import LMHead

__all__ = ["available_backends", "gpu_fused_gjsd"]


def available_backends() -> list[str]:
    """Backends usable in this process (CUDA present and the package importable)."""
    if not torch.cuda.is_available():
        return []
    found = []
    if is_available("triton") and is_available("trl"):
        found.append("trl")
    if is_available("liger_kernel"):
        found.append("liger")
    return found


def _kept_rows(student_hidden, teacher_hidden, labels):
    H_s, H_t = student_hidden.shape[-1], teacher_hidden.shape[-1]
    hs, ht = student_hidden.reshape(-1, H_s), teacher_hidden.reshape(-1, H_t)
    if labels is None:
        return hs, ht, None
    flat = labels.reshape(-1)
    keep = flat != -100
    return hs[keep], ht[keep], flat[keep]


def gpu_fused_gjsd(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    head: LMHead,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    *,
    teacher_head: LMHead | None = None,
    backend: str = "trl",
) -> torch.Tensor:
    """Mean generalized JSD over kept tokens from hidden states, with a GPU kernel backend.

    Raises:
        ImportError: the backend's package is not installed (the error names the extra).
        ValueError: unknown backend, or a head feature the backend lacks (bias, soft-capping for Liger).
    """
    teacher_head = teacher_head or head.detached()
    hs, ht, kept = _kept_rows(student_hidden, teacher_hidden, labels)
    if backend == "trl":
        require("trl", "trl", purpose="backend='trl'")
        from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

        per_token, _ = ChunkedDivergenceFunction.apply(
            hs, head.weight, head.bias, ht, teacher_head.weight, teacher_head.bias, float(beta),
            float(temperature), 1.0, head.softcap, 1.0, teacher_head.softcap,
        )  # fmt: skip
        return per_token.sum() / max(per_token.numel(), 1)
    if backend == "liger":
        require("liger", purpose="backend='liger'")
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

        if head.softcap is not None or head.bias is not None or teacher_head.bias is not None:
            raise ValueError("backend='liger' supports neither a head bias nor final-logit soft-capping")
        loss_fn = LigerFusedLinearJSDLoss(
            weight_hard_loss=0.0, weight_soft_loss=1.0, beta=float(beta), temperature=float(temperature)
        )
        labels_n = kept if kept is not None else torch.zeros(hs.shape[0], dtype=torch.long, device=hs.device)
        return loss_fn(hs, head.weight, ht, teacher_head.weight, labels_n)
    raise ValueError(f"backend={backend!r} is unknown; use 'trl' or 'liger'")
