"""TAID: Temporally Adaptive Interpolated Distillation (Shing et al., ICLR 2025, arXiv 2501.16937).

Public import path; the family (reference, chunked and fused engines, the ``t`` schedule) is
:mod:`composer_replication.losses.taid`.
"""

from composer_replication.losses.taid import TAIDScheduler, taid_loss

__all__ = ["taid_loss", "TAIDScheduler"]
