"""composer-replication: coding-agent sessions -> training signal -> a post-trained open model.

The top-level names are resolved lazily (PEP 562) so that ``import composer_replication``
never imports trl, httpx, torchft, data_juicer or a cloud SDK; a test checks ``sys.modules``.
"""

from __future__ import annotations

import importlib
from typing import Any

from composer_replication._extras import is_available

__version__ = "0.1.0"

# True iff torchft is importable. Checked without importing it (torchft pulls in torch.distributed).
_DILOCO_AVAILABLE: bool = is_available("torchft")

_EXPORTS: dict[str, str] = {
    "compose_loss": "composer_replication.loss",
    "LossComponents": "composer_replication.loss",
    "build_batch": "composer_replication.batch",
    "generalized_jsd_loss": "composer_replication.opsd",
    "ClaudeCodeIngester": "composer_replication.ingestion.claude_code",
    "IngestionStats": "composer_replication.ingestion.claude_code",
    "SYSTEM_PROMPT": "composer_replication.ingestion.claude_code",
    "DEFAULT_TEACHERS": "composer_replication.teacher_replay",
    "DPOPair": "composer_replication.teacher_replay",
    "TeacherCallResult": "composer_replication.teacher_replay",
    "TeacherSpec": "composer_replication.teacher_replay",
    "TraceState": "composer_replication.teacher_replay",
    "extract_dpo_pairs": "composer_replication.teacher_replay",
    "replay_trace": "composer_replication.teacher_replay",
    "ComposerReplicationTrainer": "composer_replication.trainer",
    "make_dr_grpo_config": "composer_replication.trainer",
    "make_po_config": "composer_replication.trainer",
    "PO_OBJECTIVES": "composer_replication.trainer",
    "make_diloco_outer_loop": "composer_replication.diloco",
}

__all__ = ["__version__", "_DILOCO_AVAILABLE", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'composer_replication' has no attribute {name!r}")
    if name == "make_diloco_outer_loop" and not _DILOCO_AVAILABLE:
        value = None
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
