"""`composer-replication train` in grpo mode on the bundled data with the tiny model (slow: ~1 min)."""

from __future__ import annotations

import json

import pytest
import yaml

from ..conftest import grpo_cfg

pytestmark = pytest.mark.slow


def test_cli_grpo_mode_runs_all_channels(small_data, tmp_path, capsys):
    from composer_replication.cli.main import main

    cfg = grpo_cfg(small_data)
    cfg["logging"] = {"progress": False}  # the default plot: losses.png is checked below
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert any(r.get("sdpo/loss", 0) > 0 for r in rows) or any(r.get("pref/loss", 0) > 0 for r in rows)
    assert (tmp_path / "run" / "losses.png").exists()
    assert list((tmp_path / "run" / "checkpoints").glob("checkpoint-*"))
    assert (tmp_path / "run" / "final" / "config.json").exists()  # trainer.export, as in offline mode


def test_cli_grpo_mode_on_every_bundled_session(ingested, tmp_path):
    """Traces from all bundled sessions together (Claude Code and Codex: tool inputs of different
    types) train in grpo mode; this crashed in datasets.Dataset.from_list before the one builder."""
    from composer_replication.cli.main import main
    from composer_replication.ingestion import read_examples

    traces = list(read_examples(ingested / "traces.jsonl"))
    assert {t["source"] for t in traces} == {"claude_code", "codex"}
    cfg = {
        "mode": "grpo",
        "model": {"path": "tiny"},
        "data": {"traces": str(ingested / "traces.jsonl"), "pairs": str(ingested / "pairs.jsonl"),
                 "max_seq_len": 192, "max_dpo_seq_len": 128},
        "loss": {"sdpo": {"weight": 0.5}, "preference": {"weight": 0.5}},
        "schedule": {"max_steps": 2, "batch_size": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 1},
        "grpo": {"num_generations": 2, "max_completion_length": 8},
        "logging": {"progress": False, "plot": False},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert any(r.get("sdpo/tokens", 0) > 0 for r in rows) and any(r.get("pref/pairs", 0) > 0 for r in rows)
