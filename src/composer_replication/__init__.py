"""composer-replication: coding-agent sessions -> training signal -> a post-trained open model.

The top-level names are resolved lazily (PEP 562) so that ``import composer_replication``
never imports trl, httpx, torchft, data_juicer or a cloud SDK; a test checks ``sys.modules``.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import is_available, lazy_attr, lazy_exports

__version__ = "0.1.0"

# True iff torchft is importable. Checked without importing it (torchft pulls in torch.distributed).
_DILOCO_AVAILABLE: bool = is_available("torchft")

_EXPORTS = lazy_exports(
    {
        "composer_replication.loss": ("compose_loss", "LossComponents"),
        "composer_replication.batch": ("build_batch",),
        "composer_replication.opsd": ("generalized_jsd_loss",),
        "composer_replication.ingestion.claude_code": ("ClaudeCodeIngester", "IngestionStats", "SYSTEM_PROMPT"),
        "composer_replication.teacher_replay": (
            "DEFAULT_TEACHERS", "DPOPair", "TeacherCallResult", "TeacherSpec", "TraceState", "extract_dpo_pairs",
            "replay_trace",
        ),
        "composer_replication.trainer": (
            "ComposerReplicationTrainer", "make_dr_grpo_config", "make_po_config", "PO_OBJECTIVES"
        ),
        "composer_replication.diloco": ("make_diloco_outer_loop",),
    }
)  # fmt: skip

__all__ = ["__version__", "_DILOCO_AVAILABLE", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name == "make_diloco_outer_loop" and not _DILOCO_AVAILABLE:
        globals()[name] = None  # the spec's value without torchft (§1)
        return None
    return lazy_attr(globals(), _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)
