"""The global state a replica publishes after each round and adopts when it is behind."""

from __future__ import annotations

import pytest
import torch

from composer_replication.diloco.serverless.store import LocalDirStore
from composer_replication.diloco.sync_store import latest_state, publish_state, state_key


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"param/w": torch.randn(5, 3, generator=g), "momentum/w": torch.randn(5, 3, generator=g)}


@pytest.fixture(params=["local", "moto"])
def store(request, tmp_path):
    return (
        LocalDirStore(tmp_path / "s") if request.param == "local" else request.getfixturevalue("moto_store")
    )


def test_first_publisher_uploads_the_others_skip_and_adopters_get_the_bits(store):
    publish_state(store, state_key("r", 0), _state(0))
    publish_state(store, state_key("r", 1), _state(1))
    puts = []
    original = store.put_if_absent

    def counting(*args, **kwargs):
        puts.append(args[0])
        return original(*args, **kwargs)

    store.put_if_absent = counting
    store.put_parts_if_absent = lambda key, parts, **kw: counting(
        key, b"".join(bytes(p) for p in parts), **kw
    )
    publish_state(store, state_key("r", 1), _state(99))  # a second replica, same round: no upload
    assert puts == []
    assert latest_state(store, "r", at_least=2) is None
    newest, tensors = latest_state(store, "r", at_least=0)
    assert newest == 1 and all(torch.equal(tensors[k], _state(1)[k]) for k in tensors)


def test_a_corrupted_state_is_refused(tmp_path):
    store = LocalDirStore(tmp_path)
    publish_state(store, state_key("r", 0), _state(0))
    path = tmp_path / state_key("r", 0)
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1  # the last byte of the last tensor
    path.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="blake3 mismatch"):
        latest_state(store, "r", at_least=0)
