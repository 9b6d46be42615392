"""The object-store all-reduce on a local directory and on a real S3 server (moto) on loopback."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from composer_replication.diloco.serverless.allreduce import (
    AllReduceError,
    fixed_order_mean,
    object_store_allreduce,
    round_prefix,
)
from composer_replication.diloco.serverless.store import LocalDirStore


def _contrib(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return {"w": torch.randn(37, 11, generator=g), "b": torch.randn(5, generator=g) * 1e3}


def _run_replicas(store, ranks, world_size, **kw):
    results, errors = {}, {}

    def body(r):
        try:
            results[r] = object_store_allreduce(
                store, _contrib(r), run_id="run", rank=r, world_size=world_size, **kw
            )
        except Exception as exc:  # surfaced by the assertions below
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def _float64_mean(ranks):
    acc = None
    for r in ranks:
        c = {k: v.double() for k, v in _contrib(r).items()}
        acc = c if acc is None else {k: acc[k] + c[k] for k in acc}
    return {k: (v / len(ranks)).float() for k, v in acc.items()}


def _stores(kind, tmp_path, moto_store):
    return LocalDirStore(tmp_path / "store") if kind == "local" else moto_store


@pytest.fixture(params=["local", "moto"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalDirStore(tmp_path / "store")
    return request.getfixturevalue("moto_store")


@pytest.mark.parametrize("n", [2, 4])
def test_all_replicas_get_identical_float64_mean(store, n):
    results = _run_replicas(store, range(n), n, round_index=0, deadline_s=30)
    ref = _float64_mean(range(n))
    for r in range(n):
        assert results[r].participants == list(range(n)) and results[r].included
        for k in ref:
            assert torch.equal(results[r].tensors[k], results[0].tensors[k])  # bit-identical
            assert torch.equal(results[r].tensors[k], ref[k])  # float64 mean, rounded once


def test_dead_replica_is_excluded_after_deadline(store):
    # rank 2 of 3 never shows up: the deadline passes and the other two agree on {0, 1}
    results = _run_replicas(store, [0, 1], 3, round_index=1, deadline_s=0.3, min_participants=2)
    ref = _float64_mean([0, 1])
    for r in (0, 1):
        assert results[r].participants == [0, 1]
        assert torch.equal(results[r].tensors["w"], ref["w"])


def test_late_replica_is_told_and_adopts_the_result(store):
    early = _run_replicas(store, [0, 1], 3, round_index=2, deadline_s=0.2, min_participants=2)
    late = object_store_allreduce(store, _contrib(2), run_id="run", round_index=2, rank=2, world_size=3)
    assert not late.included and late.participants == [0, 1]
    assert torch.equal(late.tensors["w"], early[0].tensors["w"])
    # its upload exists (create-only) but no manifest can ever include it now
    manifest = json.loads(store.get(f"{round_prefix('run', 2)}/MANIFEST.json")[0])
    assert manifest["participants"] == [0, 1]


def test_corrupted_upload_is_rejected(store):
    good = object_store_allreduce  # noqa: F841 - readability
    from safetensors.torch import save

    # rank 1's upload is damaged after its checksum was computed (bit rot / truncated transfer)
    data = save({k: v.contiguous() for k, v in sorted(_contrib(1).items())})
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    bad = bytearray(data)
    bad[-3] ^= 0xFF
    store.put_if_absent(
        f"{round_prefix('run', 3)}/delta/00001.safetensors",
        bytes(bad),
        metadata={"sha256": sha, "weight": "1.0"},
    )
    results = _run_replicas(store, [0, 2], 3, round_index=3, deadline_s=0.3, min_participants=2)
    for r in (0, 2):
        assert results[r].participants == [0, 2]
        assert "sha256 mismatch" in results[r].rejected[1]
    assert torch.equal(results[0].tensors["b"], _float64_mean([0, 2])["b"])


def test_non_finite_upload_is_rejected(tmp_path):
    store = LocalDirStore(tmp_path)
    bad = _contrib(1)
    bad["w"][0, 0] = float("nan")
    t = threading.Thread(
        target=object_store_allreduce,
        args=(store, bad),
        kwargs=dict(run_id="run", round_index=0, rank=1, world_size=2, deadline_s=0.3, timeout_s=5),
    )
    t.start()
    res = object_store_allreduce(
        store, _contrib(0), run_id="run", round_index=0, rank=0, world_size=2, deadline_s=0.3
    )
    t.join()
    assert res.participants == [0] and "non-finite" in res.rejected[1]


def test_create_only_race_has_one_winner(store):
    wins = []
    barrier = threading.Barrier(8)

    def body(i):
        barrier.wait()
        wins.append(store.put_if_absent("race/key", f"writer {i}".encode(), metadata={"i": str(i)}))

    threads = [threading.Thread(target=body, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sum(wins) == 1
    data, meta = store.get("race/key")
    assert data == f"writer {meta['i']}".encode()


def test_timeout_without_quorum(tmp_path):
    with pytest.raises(AllReduceError, match="no manifest"):
        object_store_allreduce(
            LocalDirStore(tmp_path),
            _contrib(0),
            run_id="r",
            round_index=0,
            rank=0,
            world_size=3,
            min_participants=2,
            deadline_s=0.1,
            timeout_s=0.3,
        )


def test_fixed_order_mean_weighted():
    c = {r: _contrib(r) for r in range(3)}
    out = fixed_order_mean(c, {0: 1.0, 1: 2.0, 2: 5.0})
    ref = (c[0]["w"].double() + 2 * c[1]["w"].double() + 5 * c[2]["w"].double()) / 8
    assert torch.equal(out["w"], ref.float())


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rank=3"):
        object_store_allreduce(
            LocalDirStore(tmp_path), _contrib(0), run_id="r", round_index=0, rank=3, world_size=2
        )
    with pytest.raises(ValueError, match="must not contain"):
        LocalDirStore(tmp_path).get("../etc/passwd")


@pytest.mark.slow
def test_seaweedfs_real_s3_server(seaweedfs_endpoint):
    """The same guarantees on SeaweedFS: identical float64 means, a dead replica excluded, corruption rejected."""
    import hashlib

    from safetensors.torch import save

    from composer_replication.diloco.serverless.store import S3Store

    seaweedfs_endpoint.create_bucket(Bucket="diloco")
    store = S3Store("diloco", prefix="t", client=seaweedfs_endpoint)
    assert store.put_if_absent("k", b"1") and not store.put_if_absent("k", b"2")
    results = _run_replicas(store, range(4), 4, round_index=0, deadline_s=30)
    ref = _float64_mean(range(4))
    for r in range(4):
        assert torch.equal(results[r].tensors["w"], ref["w"]) and results[r].participants == [0, 1, 2, 3]
    # round 1: rank 3 dead, rank 1's upload corrupted
    data = save({k: v.contiguous() for k, v in sorted(_contrib(1).items())})
    store.put_if_absent(
        f"{round_prefix('run', 1)}/delta/00001.safetensors",
        data[:-8] + b"\x00" * 8,
        metadata={"sha256": hashlib.sha256(data).hexdigest(), "weight": "1.0"},
    )
    results = _run_replicas(store, [0, 2], 4, round_index=1, deadline_s=0.5, min_participants=2)
    for r in (0, 2):
        assert results[r].participants == [0, 2] and "sha256" in results[r].rejected[1]
        assert torch.equal(results[r].tensors["w"], _float64_mean([0, 2])["w"])
