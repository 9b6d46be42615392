"""One command from sessions to a trained model: the stage runner, its manifest, evaluation, report.

``run_pipeline(config, run_dir)`` runs ingest -> split -> replay -> pairs -> normalize -> train_offline
-> train_grpo -> evaluate -> report in one run directory; see ``docs/pipeline.md``. Names resolve lazily
so importing the package stays light.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import lazy_attr

_EXPORTS = {
    "RunConfig": "config",
    "load_run_config": "config",
    "Manifest": "manifest",
    "Runner": "runner",
    "Stage": "runner",
    "RunContext": "runner",
    "build_stages": "stages",
    "run_pipeline": "stages",
    "demo_config": "config",
    "run_status": "status",
    "format_status": "status",
    "write_report": "report",
    "score_action": "evaluate",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attr(globals(), _EXPORTS, name)
