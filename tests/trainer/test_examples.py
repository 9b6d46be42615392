"""The train configs in examples/: each validates as a train config (the grpo one with nothing grpo mode
cannot honour), the offline one trains a couple of steps on the tiny model, and a config of the other
kind given to `train` or `run` is refused in one line that names the command to use."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from composer_replication.cli.main import main
from composer_replication.cli.validate import config_kind
from composer_replication.config import grpo_config_problems, load_config

REPO = Path(__file__).resolve().parents[2]
TRAIN_EXAMPLES = ("train_cpu.yaml", "train_grpo.yaml", "train_distributed.yaml")


def test_every_train_config_is_shipped_and_named_in_the_docs():
    shipped = sorted(p.name for p in (REPO / "examples").glob("train_*.yaml"))
    assert shipped == sorted(TRAIN_EXAMPLES)
    readme = (REPO / "examples" / "README.md").read_text()
    assert all(name in readme for name in (*TRAIN_EXAMPLES, "cpu.yaml", "gpu.yaml", "diloco_modal.yaml"))


@pytest.mark.parametrize("name", TRAIN_EXAMPLES)
def test_train_examples_validate_without_warnings(ingested, name):
    path = REPO / "examples" / name
    assert config_kind(path) == "train"
    # the file points at ../runs/ingest/traces.jsonl (what `ingest --out runs/ingest` writes); here: the fixture's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(path, {"data.traces": str(ingested / "traces.jsonl")})
    assert cfg.model.path == "default" and cfg.data.traces == ingested / "traces.jsonl"
    assert cfg.mode == ("grpo" if name == "train_grpo.yaml" else "offline")
    if cfg.mode == "grpo":
        assert grpo_config_problems(cfg) == []  # nothing grpo mode would reject
    if name == "train_distributed.yaml":
        assert cfg.distributed.strategy == "ddp" and cfg.loss.sdpo.source == "on_policy"
        assert cfg.schedule.grad_accum == 2


def test_a_missing_data_file_says_how_to_make_it(tmp_path):
    from composer_replication.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"data\.traces: file not found: .*run `composer-replication ingest`"
    ):
        load_config(REPO / "examples" / "train_cpu.yaml", {"data.traces": str(tmp_path / "none.jsonl")})


def test_the_offline_example_trains_on_the_tiny_model(small_data, tmp_path):
    from composer_replication.trainer.offline.loop import train_offline

    over = {"model.path": "tiny", "schedule.max_steps": 2, "schedule.warmup_steps": 0,
            "lora.target_modules": "all-linear", "data.traces": str(small_data / "traces.jsonl"),
            "data.pairs": str(small_data / "pairs.jsonl"), "logging.progress": False, "logging.plot": False,
            "loss.sdpo.on_policy.max_new_tokens": 4}  # fmt: skip
    cfg = load_config(REPO / "examples" / "train_cpu.yaml", over)
    final = train_offline(cfg, out_dir=tmp_path / "out")
    assert final["step"] == 2
    rows = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and all('"loss/sdpo_jsd"' in r and '"loss/trace_replay_dpo"' in r for r in rows)


@pytest.mark.parametrize(
    "command, example, words",
    [
        ("train", "cpu.yaml", "is a run config (it has evaluate, normalize, pairs, replay, run_dir, sources, "
         "student, train), not a train config: run it with `composer-replication run {path}`"),
        ("run", "train_cpu.yaml", "is a train config (it has checkpoint, data, lora, loss, mode, model, "
         "optimizer, schedule), not a run config: train with `composer-replication train {path}`"),
    ],
)  # fmt: skip
def test_a_config_of_the_other_kind_gets_one_line(command, example, words, capsys):
    path = REPO / "examples" / example
    assert main([command, str(path), "--out", "/nonexistent/never-created"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert words.format(path=path) in err
    assert not Path("/nonexistent/never-created").exists()
