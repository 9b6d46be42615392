"""Generalized Jensen-Shannon divergence for on-policy self-distillation (SDPO / OPSD channel).

The public import path of the spec (§4). The family itself — reference, argument checks, row function,
chunk plan, chunked and fused-linear engines, ``loss(..., engine=)`` — lives in
:mod:`composer_replication.losses.gjsd`; the position alignment of SDPO in
:mod:`composer_replication.losses.align`. See docs/losses.md.

Convention (TRL's GKD, OPSD and SDPO; ``p_T`` teacher, ``p_S`` student)::

    m      = (1 - beta) * p_S + beta * p_T
    JSD_b  = beta * KL(p_T || m) + (1 - beta) * KL(p_S || m)
    beta=0 -> KL(p_T || p_S) forward KL;  beta=1 -> KL(p_S || p_T) reverse KL (both unscaled, as TRL)
"""

from __future__ import annotations

from composer_replication.losses.align import align_sdpo_positions
from composer_replication.losses.common import REDUCTIONS, reduce_per_token
from composer_replication.losses.gjsd import generalized_jsd_loss, gjsd_per_token, log_probs, topk_restrict

__all__ = [
    "REDUCTIONS",
    "align_sdpo_positions",
    "generalized_jsd_loss",
    "gjsd_per_token",
    "log_probs",
    "topk_restrict",
    "reduce_per_token",
]
