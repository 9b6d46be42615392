"""Trainers: the offline loop, GRPO through TRL, distributed training and evaluation, one room each.

Rooms (subpackages): ``offline`` (the offline loop), ``grpo`` (GRPO through TRL: its configs, builder
and runs; the trainer class itself stays at its public path, ``composer_trainer``), ``distributed``
(several processes as one), ``evaluation`` (every measurement of a model). The modules beside them are
shared by the rooms: ``data_collator`` (public), ``data`` (loading and streaming rows),
``prepare`` (model, optimizer, seeding, TAID from a ``TrainConfig``), ``pair_tokens`` (preference pairs
as tokens, their reference log-probs), ``error_sites``, ``checkpoint``, ``export``, ``trackers``, ``plots``.
A room imports shared modules and the rooms below it (distributed, grpo, evaluation, offline: lowest first),
never a room above it; a shared module imports no room (tests/test_layers.py).

Importing this package (or ``composer_replication.trainer.data_collator``) never imports TRL:
the TRL-backed names are resolved lazily through PEP 562 ``__getattr__``.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr, lazy_exports

_LAZY = lazy_exports(
    {
        "composer_trainer": ("ComposerReplicationTrainer",),
        "grpo.objectives": ("make_dr_grpo_config", "make_po_config", "PO_OBJECTIVES"),
        "offline.loop": ("train_offline",),
    }
)

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
