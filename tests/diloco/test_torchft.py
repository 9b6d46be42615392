"""torchft DiLoCo on loopback: a lighthouse started here, replicas as real processes over gloo."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

from composer_replication.diloco import DiLoCo, make_diloco_outer_loop  # noqa: E402
from composer_replication.diloco.serverless.executor import DEFAULT_ENTRYPOINT  # noqa: E402
from composer_replication.diloco.serverless.local_process import LocalProcessExecutor  # noqa: E402


@pytest.fixture()
def start_lighthouse():
    from torchft._torchft import LighthouseServer

    servers = []

    def start(min_replicas: int) -> str:
        server = LighthouseServer(
            bind="127.0.0.1:0",
            min_replicas=min_replicas,
            join_timeout_ms=1000,
            quorum_tick_ms=50,
            heartbeat_timeout_ms=1000,
        )
        servers.append(server)
        return (
            f"http://127.0.0.1:{server.address().rsplit(':', 1)[1]}"  # .address() names the host, not the IP
        )

    yield start
    for server in servers:
        server.shutdown()


def _config(tmp_path: Path, lighthouse: str, **over) -> dict:
    cfg = {
        "run_id": "ft",
        "run_dir": str(tmp_path / "run"),
        "sync": "torchft",
        "torchft": {"lighthouse": lighthouse, "min_replica_size": 1, "timeout_s": 10},
        "rounds": 4,
        "inner_steps": 3,
        "inner_lr": 1e-2,
    }
    cfg.update(over)
    return cfg


def _syncs(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / f"replica-{rank}.metrics.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == "sync"]


def _by_round(run_dir: Path, ranks) -> dict[int, dict[int, str]]:
    out: dict[int, dict[int, str]] = defaultdict(dict)
    for rank in ranks:
        for row in _syncs(run_dir, rank):
            out[row["round"]][rank] = row["param_sha256"]
    return out


def _run(tmp_path, lighthouse, n, **over):
    cfg = _config(tmp_path, lighthouse, **over)
    ex = LocalProcessExecutor(cfg["run_dir"])
    results = ex.collect(ex.launch_replicas(n, DEFAULT_ENTRYPOINT, cfg), timeout=300)
    assert [r.state for r in results] == ["succeeded"] * n, [r.error for r in results]
    return Path(cfg["run_dir"]), results


def _assert_identical_after_every_sync(run_dir, ranks, rounds):
    by_round = _by_round(run_dir, ranks)
    assert set(range(1, rounds + 1)) <= set(by_round), by_round.keys()
    for rnd in range(1, rounds + 1):
        digests = by_round[rnd]
        assert len(set(digests.values())) == 1, (rnd, digests)


def test_two_replicas_bit_identical_after_every_sync(tmp_path, start_lighthouse):
    # min_replicas=2: every quorum has both replicas, so every sync averages two different models
    run_dir, results = _run(tmp_path, start_lighthouse(2), 2, rounds=3)
    _assert_identical_after_every_sync(run_dir, [0, 1], 3)
    assert results[0].value["param_sha256"] == results[1].value["param_sha256"]
    # replicas trained on different data, so a sync really averaged something
    assert all(r["participants"] == 2 for r in _syncs(run_dir, 0))


@pytest.mark.slow
def test_four_replicas_bit_identical_after_every_sync(tmp_path, start_lighthouse):
    run_dir, results = _run(tmp_path, start_lighthouse(4), 4, rounds=3)
    _assert_identical_after_every_sync(run_dir, range(4), 3)
    assert len({r.value["param_sha256"] for r in results}) == 1


@pytest.mark.slow
def test_kill_continue_restart_rejoin(tmp_path, start_lighthouse):
    # min_replicas=1: a quorum forms without the dead replica; the rejoined one heals from the survivor.
    # The run is open-ended (rounds=10_000); the test stops both replicas once the rejoin is observed.
    cfg = _config(tmp_path, start_lighthouse(1), rounds=10_000, step_sleep_s=0.05)
    run_dir = Path(cfg["run_dir"])
    ex = LocalProcessExecutor(run_dir)
    handles = ex.launch_replicas(2, DEFAULT_ENTRYPOINT, cfg)

    def wait_for(pred, what, limit=240):
        end = time.time() + limit
        while time.time() < end:
            try:
                if pred():
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    wait_for(
        lambda: all(any(r["participants"] == 2 for r in _syncs(run_dir, k)) for k in (0, 1)),
        "a 2-replica sync",
    )
    ex.kill(handles[1])  # SIGKILL mid-run
    killed_at = len(_syncs(run_dir, 1))
    n0 = len(_syncs(run_dir, 0))
    wait_for(lambda: len(_syncs(run_dir, 0)) >= n0 + 3, "the survivor to go on alone")
    assert ex.poll(handles[0]) == "running"
    restarted = ex.launch_one(1, 2, DEFAULT_ENTRYPOINT, cfg)
    wait_for(lambda: len(_syncs(run_dir, 1)) >= killed_at + 3, "the restarted replica to sync")
    ex.cancel(handles[0])
    ex.cancel(restarted)
    survivor = _syncs(run_dir, 0)
    assert any(r["participants"] == 1 for r in survivor)  # it ran alone while 1 was dead
    rejoined = _syncs(run_dir, 1)[killed_at:]
    assert rejoined[0]["round"] > killed_at + 1, "it healed from the survivor instead of starting over"
    by_round = {r["round"]: r["param_sha256"] for r in survivor}
    common = [row for row in rejoined if row["round"] in by_round]
    assert len(common) >= 2
    for row in common:  # after rejoining, it matches the survivor at every sync
        assert row["param_sha256"] == by_round[row["round"]], row["round"]


class _Manager:
    """The manager surface DiLoCo touches before any sync (torchft's own tests mock it the same way)."""

    _use_async_quorum = False

    def register_state_dict_fn(self, *a, **k):
        pass


def test_make_diloco_outer_loop_defaults_and_streaming_fragments():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    inner = torch.optim.AdamW(model.parameters())
    outer = make_diloco_outer_loop(_Manager(), [model], inner, sync_every=10)
    assert isinstance(outer, DiLoCo)
    opt = outer._fragments[0]._outer_optimizer
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.7, 0.9, True)
    streaming = make_diloco_outer_loop(
        _Manager(), list(model), inner, sync_every=10, fragment_sync_delay=2, fragment_update_alpha=0.5
    )
    assert len(streaming._fragments) == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sync_every": 9}, "multiple of the number of fragments"),
        ({"sync_every": 1}, "multiple of the number of fragments"),
        ({"sync_every": 10, "fragment_sync_delay": 5}, "fragment_sync_delay=5"),
        ({"sync_every": 10, "fragment_update_alpha": 1.5}, "fragment_update_alpha"),
        ({"sync_every": 10, "outer_lr": 0}, "outer_lr"),
        ({"sync_every": 10, "outer_momentum": 0.0}, "nesterov"),
    ],
)
def test_make_diloco_outer_loop_rejects_bad_schedules(kwargs, match):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    with pytest.raises(ValueError, match=match):
        make_diloco_outer_loop(_Manager(), list(model), torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_missing_torchft_raises(monkeypatch):
    import composer_replication.diloco as d

    monkeypatch.setattr(d, "_TORCHFT_AVAILABLE", False, raising=False)
    with pytest.raises(RuntimeError, match=r"composer-replication\[torchft\]"):
        d.make_diloco_outer_loop(None, [torch.nn.Linear(2, 2)], None)
