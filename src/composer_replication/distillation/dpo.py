"""Sigmoid DPO over summed sequence log-ratios (Rafailov et al. 2023, arXiv 2305.18290; TRL ``loss_type="sigmoid"``).

Public import path; the implementation is :mod:`composer_replication.losses.preference`.
"""

from composer_replication.losses.preference import dpo_loss

__all__ = ["dpo_loss"]
