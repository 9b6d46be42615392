"""API reference §1, `composer_replication`: the top-level re-exports, `__version__`, `_DILOCO_AVAILABLE`."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

TOP_LEVEL = {
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
    # §10: "Exported from both composer_replication and composer_replication.trainer".
    "make_dr_grpo_config": "composer_replication.trainer",
    "make_po_config": "composer_replication.trainer",
    "PO_OBJECTIVES": "composer_replication.trainer",
}


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
def test_top_level_reexport(name):
    import composer_replication

    source = importlib.import_module(TOP_LEVEL[name])
    assert hasattr(source, name), f"{TOP_LEVEL[name]}.{name} is missing"
    assert getattr(composer_replication, name) is getattr(source, name)


MODULES = [
    "composer_replication",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_version_and_diloco_flag():
    import composer_replication

    assert composer_replication.__version__ == "0.1.0"
    has_torchft = importlib.util.find_spec("torchft") is not None
    assert composer_replication._DILOCO_AVAILABLE is has_torchft
