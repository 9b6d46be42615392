"""Pluggable distillation and preference losses (spec §5): the public import paths.

- :mod:`.taid` — TAID interpolated distillation and its adaptive ``t`` schedule (arXiv 2501.16937)
- :mod:`.entropy_aware_opd` — entropy-gated forward/reverse KL (arXiv 2603.07079)
- :mod:`.simpo` — SimPO, reference-free preference loss (arXiv 2405.14734)
- :mod:`.dpo` — sigmoid DPO over summed log-ratios (arXiv 2305.18290)

Each family lives in one file of :mod:`composer_replication.losses` (``taid``, ``eopd``,
``preference``) with its chunked and fused-linear engines; the generalized JSD is
:mod:`composer_replication.opsd` (:mod:`composer_replication.losses.gjsd`).
"""

from composer_replication.distillation.dpo import dpo_loss
from composer_replication.distillation.entropy_aware_opd import entropy_aware_opd_loss, teacher_entropy
from composer_replication.distillation.simpo import avg_sequence_logprob, simpo_loss
from composer_replication.distillation.taid import TAIDScheduler, taid_loss

__all__ = [
    "TAIDScheduler",
    "avg_sequence_logprob",
    "dpo_loss",
    "entropy_aware_opd_loss",
    "simpo_loss",
    "taid_loss",
    "teacher_entropy",
]
