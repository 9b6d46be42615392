"""SimPO: reference-free preference loss with a target margin (Meng et al. 2024, arXiv 2405.14734).

Public import path; the implementation is :mod:`composer_replication.losses.preference`.
"""

from composer_replication.losses.preference import avg_sequence_logprob, simpo_loss

__all__ = ["simpo_loss", "avg_sequence_logprob"]
