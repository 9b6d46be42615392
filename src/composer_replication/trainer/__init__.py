"""Trainers: the GRPO subclass with the three-channel loss, the PO presets and the offline trainer.

Importing this package (or ``composer_replication.trainer.data_collator``) never imports TRL:
the TRL-backed names are resolved lazily through PEP 562 ``__getattr__``.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr, lazy_exports

_LAZY = lazy_exports(
    {
        "composer_trainer": ("ComposerReplicationTrainer",),
        "po_objectives": ("make_dr_grpo_config", "make_po_config", "PO_OBJECTIVES"),
        "offline": ("train_offline",),
    }
)

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
