"""The all-reduce's zero-copy pieces: safetensors encode/decode (strict, interchangeable with the
safetensors library), streaming reads hashed on the way in, the fast finiteness check, and the
sliced float64 mean (bit-identical to the whole-tensor accumulation it replaced)."""

from __future__ import annotations

import hashlib
import json
import struct
import threading

import pytest
import torch
from safetensors.torch import load, save

from composer_replication.diloco.serverless.allreduce import (
    fixed_order_mean,
    object_store_allreduce,
    read_object,
    round_prefix,
)
from composer_replication.diloco.serverless.store import LocalDirStore
from composer_replication.diloco.serverless.tensorfile import decode, encode
from composer_replication.diloco.serverless.tensorfile import finite as _finite


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(7, 5, generator=g),
        "half": torch.randn(3, generator=g).to(torch.bfloat16),
        "d": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i": torch.arange(5, dtype=torch.int8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "t": torch.randn(4, 6, generator=g).t(),  # non-contiguous input
    }


def _blob(parts) -> bytes:
    return b"".join(bytes(p) for p in parts)


def test_encode_is_read_by_safetensors_and_decode_reads_safetensors():
    t = _tensors()
    back = load(_blob(encode(t)))
    mine = decode(bytearray(save({k: v.contiguous() for k, v in t.items()})))
    for k, v in t.items():
        assert torch.equal(back[k], v) and back[k].dtype == v.dtype and back[k].shape == v.shape
        assert torch.equal(mine[k], v) and mine[k].dtype == v.dtype and mine[k].shape == v.shape


def test_decode_returns_views_on_the_buffer():
    buf = bytearray(_blob(encode({"w": torch.zeros(4)})))
    w = decode(buf)["w"]
    buf[-4:] = struct.pack("<f", 7.0)  # the last element's bytes
    assert w[-1].item() == 7.0


def _raw(text: bytes, data: bytes) -> bytearray:
    return bytearray(struct.pack("<Q", len(text)) + text + data)


def _file(header: dict, data: bytes, pad: bool = True) -> bytearray:
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return bytearray(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(
    ("buf", "match"),
    [
        (bytearray(b"\x01\x02"), "shorter than the 8-byte header length"),
        (bytearray(struct.pack("<Q", 10**6) + b"{}"), "does not fit"),
        (bytearray(struct.pack("<Q", 4) + b"{no}"), "not valid JSON"),
        (bytearray(struct.pack("<Q", 2) + b"[]"), "not a JSON object"),
        (
            _raw(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {}}', bytes(4)),
            "duplicate tensor name",
        ),  # fmt: skip  # fmt: skip
        (_file({"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)), "unsupported dtype"),
        (_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4)), "4 bytes for shape"),
        (_file({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4)), "non-negative"),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}, bytes(4)), "outside"),
        (
            _file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8)),
            "a gap or an overlap",
        ),
        (
            _file(
                {
                    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                    "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                },
                bytes(8),
            ),  # fmt: skip
            "a gap or an overlap",
        ),
        (_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8)), "cover 4 of the 8"),
        (_file({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)), "exactly dtype, shape and data_offsets"),
        (_file({"__metadata__": {"k": 1}}, b""), "__metadata__"),
    ],
)
def test_decode_rejects_malformed_files(buf, match):
    with pytest.raises(ValueError, match=match):
        decode(buf)


def test_malformed_upload_with_a_valid_checksum_is_rejected(tmp_path):
    # a replica that hashes garbage correctly: the checksum passes, the structure check does not
    store = LocalDirStore(tmp_path)
    junk = bytes(_file({"w": {"dtype": "F32", "shape": [9], "data_offsets": [0, 36]}}, bytes(8)))
    store.put_if_absent(f"{round_prefix('run', 0)}/delta/00001.safetensors", junk,
                        metadata={"sha256": hashlib.sha256(junk).hexdigest(), "weight": "1.0"})  # fmt: skip
    res = object_store_allreduce(
        store, {"w": torch.ones(9)}, run_id="run", round_index=0, rank=0, world_size=2, deadline_s=0.2
    )
    assert res.participants == [0] and "not a safetensors file" in res.rejected[1]


def test_read_object_streams_and_hashes(tmp_path):
    store = LocalDirStore(tmp_path)
    data = bytes(range(256)) * 40_000  # 10 MB: several read chunks
    store.put_parts_if_absent("k", [data[:5], memoryview(data)[5:]], metadata={"m": "1"})
    buf, meta, sha = read_object(store, "k")
    assert bytes(buf) == data and meta == {"m": "1"} and sha == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.get("k") == (data, {"m": "1"})

    class Plain:  # a store with only the basic protocol still works
        get = store.get

    assert read_object(Plain(), "k")[2] == sha


def test_finite_check():
    assert _finite(torch.tensor([3e38, 3e38]))  # the sum overflows, the values are finite
    assert not _finite(torch.tensor([1.0, float("nan")]))
    assert not _finite(torch.tensor([float("inf"), float("-inf")]))
    assert not _finite(torch.tensor([float("-inf")], dtype=torch.bfloat16))
    assert _finite(torch.zeros(0)) and _finite(torch.arange(3))


def _whole_tensor_mean(contributions, weights):
    """The accumulation fixed_order_mean replaced: one float64 tensor per name, ranks in order."""
    ranks = sorted(contributions)
    total = sum(weights[r] for r in ranks)
    out = {}
    for name, ref in contributions[ranks[0]].items():
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for r in ranks:
            acc.add_(contributions[r][name], alpha=weights[r])
        out[name] = acc.div_(total).to(ref.dtype)
    return out


@pytest.mark.parametrize(
    "weights",
    [
        {0: 1.0, 1: 1.0, 2: 1.0},
        {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0},
        {0: 0.3, 1: 1 / 3, 2: 7.1},
        {0: 1.0, 1: 0.5, 2: 2.5},
    ],
)
def test_sliced_mean_is_bit_identical_to_whole_tensor_accumulation(weights):
    g = torch.Generator().manual_seed(1)
    contributions = {
        r: {
            "big": torch.randn(3 * 65536 + 17, generator=g) * 10.0**r,  # several slices and a ragged tail
            "m": torch.randn(33, 47, generator=g),
            "bf": torch.randn(100, generator=g).to(torch.bfloat16),
            "f64": torch.randn(70_001, generator=g, dtype=torch.float64),
            "nc": torch.randn(300, 200, generator=g).t(),
        }
        for r in weights
    }
    contributions[0]["big"][:5] = -0.0  # signed zeros everywhere in the first slots
    for r in weights:
        contributions[r]["m"][0, :3] = -0.0
    ref, got = _whole_tensor_mean(contributions, weights), fixed_order_mean(contributions, weights)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape
        assert torch.equal(got[k].contiguous().view(torch.uint8), ref[k].contiguous().view(torch.uint8)), k


def test_upload_and_downloads_overlap_and_agree(tmp_path):
    # four replicas at once on one store: every one gets the same bits (the upload runs in the pool)
    store = LocalDirStore(tmp_path)
    g = torch.Generator().manual_seed(2)
    contrib = {r: {"w": torch.randn(1000, generator=g), "b": torch.randn(3, generator=g)} for r in range(4)}
    out = {}

    def body(r):
        out[r] = object_store_allreduce(store, contrib[r], run_id="o", round_index=0, rank=r, world_size=4)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(4)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    ref = fixed_order_mean(contrib)
    for r in range(4):
        assert out[r].participants == [0, 1, 2, 3] and torch.equal(out[r].tensors["w"], ref["w"])


def _upload(store, run, r, tensors, *, damage=None, weight="1.0"):
    data = b"".join(bytes(p) for p in encode(tensors))
    sha = hashlib.sha256(data).hexdigest()
    if damage is not None:
        data = damage(data)
    store.put_if_absent(f"{round_prefix(run, 0)}/delta/{r:05d}.safetensors", data,
                        metadata={"sha256": sha, "weight": weight})  # fmt: skip


def _contribs(n, size=300_000, seed=3):
    g = torch.Generator().manual_seed(seed)
    return {r: {"w": torch.randn(size, generator=g), "b": torch.randn(7, 3, generator=g), "z": torch.zeros(0)}
            for r in range(n)}  # fmt: skip


@pytest.fixture(params=["local", "moto"])
def any_store(request, tmp_path):
    return (
        LocalDirStore(tmp_path / "s") if request.param == "local" else request.getfixturevalue("moto_store")
    )


@pytest.mark.parametrize("weights", [("1.0", "1.0", "1.0"), ("0.3", "2.0", "7.1")])
def test_last_replica_streams_and_matches_the_reference_bits(any_store, weights):
    c = _contribs(4)
    for r in (1, 2, 3):
        _upload(any_store, "s", r, c[r], weight=weights[r - 1])
    res = object_store_allreduce(any_store, c[0], run_id="s", round_index=0, rank=0, world_size=4)
    assert res.streamed and res.participants == [0, 1, 2, 3] and res.included
    ref = fixed_order_mean(c, {0: 1.0, **{r: float(weights[r - 1]) for r in (1, 2, 3)}})
    for k in ref:
        assert torch.equal(res.tensors[k], ref[k]) and res.tensors[k].shape == ref[k].shape
    # an early replica (general path) reads the manifest and gets the same bits
    late = object_store_allreduce(
        any_store, c[1], run_id="s", round_index=0, rank=1, world_size=4, upload=False
    )
    assert not late.streamed and torch.equal(late.tensors["w"], res.tensors["w"])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[:-3] + bytes([d[-3] ^ 0xFF]) + d[-2:], "sha256 mismatch"),  # bit rot in the last window
        (lambda d: d[: len(d) // 2], "sha256 mismatch"),  # truncated: the general path judges it
    ],
)
def test_streaming_falls_back_when_an_upload_is_bad(tmp_path, damage, reason):
    store = LocalDirStore(tmp_path)
    c = _contribs(3)
    _upload(store, "s", 1, c[1], damage=damage)
    _upload(store, "s", 2, c[2])
    res = object_store_allreduce(store, c[0], run_id="s", round_index=0, rank=0, world_size=3, deadline_s=0.2)
    assert not res.streamed and res.participants == [0, 2] and reason in res.rejected[1]
    assert torch.equal(res.tensors["w"], fixed_order_mean({0: c[0], 2: c[2]})["w"])


def test_streaming_rejects_non_finite_and_foreign_layouts(tmp_path):
    store = LocalDirStore(tmp_path)
    c = _contribs(4)
    c[1]["w"][250_000] = float("inf")  # deep inside a later window
    _upload(store, "s", 1, c[1])
    _upload(store, "s", 2, {"other": c[2]["w"], "b": c[2]["b"], "z": c[2]["z"]})  # different names
    _upload(store, "s", 3, c[3])
    res = object_store_allreduce(store, c[0], run_id="s", round_index=0, rank=0, world_size=4, deadline_s=0.2)
    assert res.participants == [0, 3] and "w: non-finite values" in res.rejected[1]
    assert "tensor names differ" in res.rejected[2]


@pytest.mark.parametrize("weight", ["nan", "-1", "0", "inf", "heavy"])
def test_an_upload_with_a_bad_weight_is_rejected(tmp_path, weight):
    # one NaN weight in a manifest would make every replica's mean NaN
    store = LocalDirStore(tmp_path)
    c = _contribs(3, size=1000)
    _upload(store, "s", 1, c[1], weight=weight)
    _upload(store, "s", 2, c[2])
    res = object_store_allreduce(store, c[0], run_id="s", round_index=0, rank=0, world_size=3, deadline_s=0.2)
    assert res.participants == [0, 2] and "is not a finite positive number" in res.rejected[1]
    assert torch.isfinite(res.tensors["w"]).all()


def test_uploads_carry_a_blake3_digest_and_a_mismatch_is_named(tmp_path):
    import blake3

    store = LocalDirStore(tmp_path)
    c = _contribs(2, size=1000)
    res = object_store_allreduce(store, c[0], run_id="d", round_index=0, rank=0, world_size=1)
    data, meta = store.get(f"{round_prefix('d', 0)}/delta/00000.safetensors")
    assert meta["blake3"] == blake3.blake3(data).hexdigest() and "sha256" not in meta
    manifest = json.loads(store.get(f"{round_prefix('d', 0)}/MANIFEST.json")[0])
    assert manifest["digests"] == {"0": "blake3:" + meta["blake3"]} and res.participants == [0]
    # a blake3-tagged upload whose bytes changed after hashing is rejected, naming the algorithm
    good = b"".join(bytes(p) for p in encode(c[1]))
    bad = good[:-1] + bytes([good[-1] ^ 1])
    store.put_if_absent(f"{round_prefix('e', 0)}/delta/00001.safetensors", bad,
                        metadata={"blake3": blake3.blake3(good).hexdigest(), "weight": "1.0"})  # fmt: skip
    res = object_store_allreduce(store, c[0], run_id="e", round_index=0, rank=0, world_size=2, deadline_s=0.2)
    assert res.participants == [0] and res.rejected[1].startswith("blake3 mismatch")
