"""DiLoCo replicas whose inner steps are the offline trainer's (SFT CE + α·SDPO + β·DPO via compose_loss):
two local_process replicas over the local-directory store, against the single-process simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

SESSIONS = Path(__file__).resolve().parents[1] / "data" / "sessions" / "claude_code"
# small real sessions with tool errors (SOURCES.md): enough traces and pairs, ingested in a second or two
SMALL = [
    "d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
    "iansherr__claude-code-log__29ccd257-68b1-427f-ae5f-6524b7cb6f20.jsonl",
    "marot__spotter__short.jsonl",
]


@pytest.fixture(scope="module")
def offline_data(tmp_path_factory) -> Path:
    """Real traces (ingested from the bundled sessions) with a hinted SDPO site, and real recovery pairs."""
    from composer_replication.ingestion import ingest_paths, read_examples
    from composer_replication.models import build_tiny_tokenizer
    from composer_replication.trainer.data import make_collator, recovery_pairs, trace_batch

    out = tmp_path_factory.mktemp("diloco-offline")
    ingest_paths([SESSIONS / name for name in SMALL], out / "ingested")
    traces = list(read_examples(out / "ingested" / "traces.jsonl"))
    collator = make_collator(build_tiny_tokenizer(2048), 192, 96, True)
    sites = [
        t for t in traces if trace_batch(collator, [t]).get("sdpo_loss_mask", torch.zeros(1, 1)).sum() > 0
    ]
    (out / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in sites[:4]))
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in recovery_pairs(traces)[:4]))
    return out


def _config(data: Path, tmp_path: Path, **over) -> dict:
    cfg = {
        "run_id": "offline-inner",
        "store": {"type": "local", "root": str(tmp_path / "store")},
        "rounds": 2,
        "inner_steps": 2,
        "deadline_s": 120,
        "inner": "offline",
        "offline": {
            "model": {"path": "tiny"},
            "data": {"traces": str(data / "traces.jsonl"), "pairs": str(data / "pairs.jsonl"),
                     "max_seq_len": 192, "max_dpo_seq_len": 96, "eval_fraction": 0.0},
            "loss": {"sdpo": {"weight": 1.0}, "preference": {"weight": 1.0}},
            "optimizer": {"lr": 3e-3},
            "schedule": {"batch_size": 1},
            "logging": {"progress": False, "plot": False},
        },
    }  # fmt: skip
    cfg.update(over)
    return cfg


def test_offline_inner_replicas_match_the_simulation_bit_for_bit(offline_data, tmp_path):
    from composer_replication.diloco.serverless.executor import DEFAULT_ENTRYPOINT
    from composer_replication.diloco.serverless.local_process import LocalProcessExecutor
    from composer_replication.diloco.serverless.simulate import simulate_diloco

    run_dir = tmp_path / "run"
    cfg = _config(offline_data, tmp_path, run_dir=str(run_dir))
    ex = LocalProcessExecutor(run_dir)
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg)
    sim = simulate_diloco(cfg, world_size=2)  # runs while the replica processes do
    results = ex.collect(handles, timeout=300)
    assert [r.state for r in results] == ["succeeded", "succeeded"], [r.error for r in results]

    syncs = {
        rank: [
            row
            for row in map(json.loads, (run_dir / f"replica-{rank}.metrics.jsonl").read_text().splitlines())
            if row["event"] == "sync"
        ]
        for rank in (0, 1)
    }
    for r in range(2):  # after every sync both replicas hold the same bits
        assert syncs[0][r]["param_sha256"] == syncs[1][r]["param_sha256"]
        assert syncs[0][r]["participants"] == [0, 1]
    for rank in (0, 1):
        final = json.loads((run_dir / f"replica-{rank}.result.json").read_text())["param_sha256"]
        assert final == sim["param_sha256"]
        for r, row in enumerate(syncs[rank]):
            m, s = row["metrics"], sim["metrics"][rank][r]
            # all three channels were trained, and the logged per-channel means are the simulation's
            for channel in ("loss/lm_ce", "loss/sdpo_jsd", "loss/trace_replay_dpo"):
                assert channel in m and m[channel] == pytest.approx(s[channel], abs=1e-6)
            assert m["loss/lm_ce"] > 0 and m["loss/trace_replay_dpo"] > 0
            assert row["loss"] == pytest.approx(sim["losses"][rank][r], abs=1e-6)
    # the two replicas trained on different shards: their inner losses differ
    assert sim["losses"][0] != sim["losses"][1]


def test_offline_stepper_step_matches_train_offline(offline_data, tmp_path):
    """The per-step API is the offline trainer: same seed, same data -> train_offline's logged losses."""
    from composer_replication.config import build_config
    from composer_replication.trainer.offline.loop import train_offline
    from composer_replication.trainer.offline.stepper import make_offline_stepper

    section = _config(offline_data, tmp_path)["offline"]
    section = {**section, "schedule": {"batch_size": 1, "max_steps": 2}, "checkpoint": {"every_steps": 0}}
    cfg = build_config(section)
    train_offline(cfg, out_dir=tmp_path / "offline", device="cpu")
    logged = [json.loads(x) for x in (tmp_path / "offline" / "metrics.jsonl").read_text().splitlines()]
    torch.manual_seed(cfg.seed)
    stepper = make_offline_stepper(cfg, device="cpu")
    rows = [stepper.step() for _ in range(2)]
    for row, log in zip(rows, logged):
        assert row["loss/total"] == pytest.approx(log["loss/total"], rel=1e-6)
        assert row["loss/trace_replay_dpo"] == pytest.approx(log["loss/trace_replay_dpo"], rel=1e-6)
    state = stepper.state_dict()
    assert state["step"] == 2 and state["trace_stream"]["pos"] == 2


def test_offline_inner_config_errors(offline_data, tmp_path):
    from pydantic import ValidationError

    from composer_replication.diloco.serverless.replica_entrypoint import ReplicaConfig

    with pytest.raises(ValidationError, match="inner: offline needs an `offline` section"):
        ReplicaConfig.model_validate(_config(offline_data, tmp_path, offline=None))
    bad = _config(offline_data, tmp_path)
    bad["offline"] = {**bad["offline"], "optimizr": {}}
    with pytest.raises(ValidationError, match="optimizr: unknown key"):
        ReplicaConfig.model_validate(bad)
    with pytest.raises(ValidationError, match="object_store only"):
        ReplicaConfig.model_validate(
            _config(offline_data, tmp_path, sync="torchft", torchft={"lighthouse": "http://127.0.0.1:1"})
        )
    cfg = ReplicaConfig.model_validate(_config(offline_data, tmp_path))
    assert cfg.offline_train_config().schedule.max_steps == 4  # rounds × inner_steps
