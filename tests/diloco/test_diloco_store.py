"""DiLoCo over the object store with local_process replicas, against the single-process simulation,
driven through the real CLI (`composer-replication launch`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import yaml

from composer_replication.cli.main import main
from composer_replication.diloco.serverless.executor import DEFAULT_ENTRYPOINT
from composer_replication.diloco.serverless.local_process import LocalProcessExecutor
from composer_replication.diloco.serverless.simulate import simulate_diloco

TINY = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}


def _config(tmp_path: Path, store: dict, **over) -> dict:
    cfg = {
        "run_id": "store-run",
        "store": store,
        "rounds": 3,
        "inner_steps": 4,
        "inner_lr": 3e-2,
        "model": TINY,
        "deadline_s": 60,
    }
    cfg.update(over)
    return cfg


def _metrics(run_dir: Path, rank: int, event: str = "sync") -> list[dict]:
    rows = map(json.loads, (run_dir / f"replica-{rank}.metrics.jsonl").read_text().splitlines())
    return [r for r in rows if r["event"] == event]


def test_cli_launch_local_matches_simulation_bit_for_bit(tmp_path, moto_endpoint, capsys):
    bucket = "diloco-parity"
    store = {"type": "s3", "bucket": bucket, "prefix": "p", "endpoint_url": moto_endpoint, "region": "us-east-1"}
    from composer_replication.diloco.serverless.store import S3Store

    S3Store(bucket, endpoint_url=moto_endpoint, region="us-east-1", create_bucket=True)
    cfg_path = tmp_path / "diloco.yaml"
    cfg_path.write_text(yaml.safe_dump(_config(tmp_path, store)))
    run_dir = tmp_path / "run"
    rc = main(["launch", "--backend", "local", "--replicas", "2", "--run-dir", str(run_dir), "--refresh", "0.2", str(cfg_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "rank  state" in out and "succeeded" in out and "2/2 replicas succeeded" in out

    sim = simulate_diloco(_config(tmp_path, store), world_size=2)
    for rank in (0, 1):
        result = json.loads((run_dir / f"replica-{rank}.result.json").read_text())
        # one intra-op thread everywhere + the same fixed-order float64 mean -> the same bits
        assert result["param_sha256"] == sim["param_sha256"]
        syncs = _metrics(run_dir, rank)
        assert [s["participants"] for s in syncs] == [[0, 1]] * 3
        assert [round(s["loss"], 5) for s in syncs] == [round(x, 5) for x in sim["losses"][rank]]
    # it trains: the mean inner loss falls from the first round to the last
    assert sim["losses"][0][-1] < sim["losses"][0][0] - 0.05


def test_outer_step_with_lr1_no_momentum_is_parameter_averaging(tmp_path):
    # algorithms.md §8.1 sanity check: outer SGD lr=1, momentum 0 -> theta = mean_i theta_i
    from composer_replication.diloco.serverless.allreduce import fixed_order_mean
    from composer_replication.diloco.serverless.simulate import OuterOptimizer, pseudo_gradient

    base = {"w": torch.randn(3, 4, dtype=torch.float32)}
    models = []
    for seed in range(3):
        m = torch.nn.Module()
        m.w = torch.nn.Parameter(base["w"] + torch.randn(3, 4, generator=torch.Generator().manual_seed(seed)))
        models.append(m)
    outer = OuterOptimizer(base, lr=1.0, momentum=0.0, nesterov=False)
    outer.step(fixed_order_mean({i: pseudo_gradient(outer.params, m) for i, m in enumerate(models)}))
    ref = sum(m.w.detach().double() for m in models) / 3
    assert torch.allclose(outer.params["w"].double(), ref, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_replica_killed_and_restarted_rejoins_from_the_store(tmp_path):
    store = {"type": "local", "root": str(tmp_path / "store")}
    cfg = _config(tmp_path, store, rounds=12, inner_steps=2, step_sleep_s=0.1, deadline_s=2.0,
                  run_dir=str(tmp_path / "run"))  # fmt: skip
    run_dir = tmp_path / "run"
    ex = LocalProcessExecutor(run_dir)
    handles = ex.launch_replicas(3, DEFAULT_ENTRYPOINT, cfg)
    end = time.time() + 180
    while time.time() < end:
        f = run_dir / "replica-2.metrics.jsonl"
        if f.exists() and len(_metrics(run_dir, 2)) >= 2:
            break
        time.sleep(0.2)
    ex.kill(handles[2])
    time.sleep(4)  # at least one round closes on the deadline without rank 2
    restarted = ex.launch_one(2, 3, DEFAULT_ENTRYPOINT, cfg)
    results = ex.collect([handles[0], handles[1], restarted], timeout=300)
    assert [r.state for r in results] == ["succeeded"] * 3, [r.error for r in results]
    assert len({r.value["param_sha256"] for r in results}) == 1
    survivors = _metrics(run_dir, 0)
    assert any(s["participants"] == [0, 1] for s in survivors)  # rounds without the dead replica
    assert survivors[-1]["participants"] == [0, 1, 2]  # it rejoined
    assert _metrics(run_dir, 2, "adopt"), "the restarted replica adopted the published global state"
    by_round = {s["round"]: s["param_sha256"] for s in survivors}
    for s in _metrics(run_dir, 2):
        assert s["param_sha256"] == by_round[s["round"]]
