"""One command from sessions to a trained model: the stage runner, its manifest, evaluation, report.

``run_pipeline(config, run_dir)`` runs ingest -> split -> replay -> pairs -> normalize -> train_offline
-> train_grpo -> evaluate -> report in one run directory; see ``docs/pipeline.md``. Names resolve lazily
so importing the package stays light.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr, lazy_exports

_EXPORTS = lazy_exports(
    {
        "config": ("RunConfig", "load_run_config", "demo_config"),
        "manifest": ("Manifest",),
        "runner": ("Runner", "Stage", "RunContext"),
        "stages": ("build_stages", "run_pipeline"),
        "status": ("run_status", "format_status"),
        "report": ("write_report",),
        "evaluate": ("score_action",),
    }
)

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _EXPORTS, name)
