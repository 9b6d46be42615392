"""Fixtures: the bundled real sessions ingested once, plus small traces/pairs files for tiny-model runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

SESSIONS = Path(__file__).resolve().parents[1] / "data" / "sessions"


@pytest.fixture(scope="session")
def ingested(tmp_path_factory) -> Path:
    """``traces.jsonl`` from the bundled sessions (ingestion's own code) + recovery ``pairs.jsonl``."""
    from composer_replication.ingestion import ingest_paths, read_examples
    from composer_replication.trainer.data import recovery_pairs

    out = tmp_path_factory.mktemp("ingested")
    ingest_paths([SESSIONS], out)
    traces = list(read_examples(out / "traces.jsonl"))
    with open(out / "pairs.jsonl", "w") as fh:
        for pair in recovery_pairs(traces):
            fh.write(json.dumps(pair) + "\n")
    return out


@pytest.fixture(scope="session")
def small_data(ingested, tmp_path_factory) -> Path:
    """A few real traces with tool errors and a few real pairs (tiny-model tests)."""
    out = tmp_path_factory.mktemp("small")
    from composer_replication.ingestion import read_examples

    traces = list(read_examples(ingested / "traces.jsonl"))
    from composer_replication.models import build_tiny_tokenizer
    from composer_replication.trainer.data import make_collator, trace_batch

    collator = make_collator(build_tiny_tokenizer(2048), 256, 128, True)
    # traces whose error site yields a hinted SDPO row at this length (so every batch has all three channels)
    sites = [
        t for t in traces if trace_batch(collator, [t]).get("sdpo_loss_mask", torch.zeros(1, 1)).sum() > 0
    ]
    (out / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in sites[:6]))
    pairs = (ingested / "pairs.jsonl").read_text().splitlines()[:8]
    (out / "pairs.jsonl").write_text("".join(p + "\n" for p in pairs))
    return out


def tiny_config(data_dir: Path, **sections) -> dict:
    cfg = {
        "mode": "offline",
        "model": {"path": "tiny"},
        "data": {"traces": str(data_dir / "traces.jsonl"), "pairs": str(data_dir / "pairs.jsonl"), "max_seq_len": 256,
                 "max_dpo_seq_len": 128},
        # recorded: what these tests were written against (on_policy, the default since the learning
        # benchmark, has its own tests in test_onpolicy.py, which set it)
        "loss": {"sdpo": {"weight": 1.0, "source": "recorded"}, "preference": {"weight": 1.0}},
        "optimizer": {"lr": 3e-3},
        "schedule": {"max_steps": 6, "batch_size": 2},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "logging": {"progress": False, "plot": False},
    }  # fmt: skip
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


@pytest.fixture()
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def grpo_cfg(small_data: Path, **grpo) -> dict:
    """A grpo-mode config dict on ``small_data`` with all three channels; ``grpo`` overrides its section."""
    return {
        "mode": "grpo",
        "model": {"path": "tiny"},
        "data": {"traces": str(small_data / "traces.jsonl"), "pairs": str(small_data / "pairs.jsonl"),
                 "max_seq_len": 128, "max_dpo_seq_len": 128},
        "loss": {"sdpo": {"weight": 0.5}, "preference": {"weight": 0.5}},
        "optimizer": {"lr": 1e-3},
        "schedule": {"max_steps": 2, "batch_size": 4},
        "checkpoint": {"every_steps": 1, "keep_last": 1},
        "grpo": {"objective": "dr_grpo", "num_generations": 4, "max_completion_length": 8, **grpo},
        "logging": {"progress": False, "plot": False},
    }  # fmt: skip
