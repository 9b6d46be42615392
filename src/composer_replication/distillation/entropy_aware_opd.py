"""Entropy-aware on-policy distillation: forward KL where the teacher is unsure, reverse KL where it is sure.

After Jin et al., "Entropy-Aware On-Policy Distillation" (ICML 2026, arXiv 2603.07079). Public import
path; the family (reference, chunked and fused engines) is :mod:`composer_replication.losses.eopd`.
"""

from composer_replication.losses.eopd import entropy_aware_opd_loss, teacher_entropy

__all__ = ["entropy_aware_opd_loss", "teacher_entropy"]
