"""A fault-tolerant all-reduce (mean) through an object store, for replicas that cannot reach each other.

The leaderless manifest protocol (design notes: interfaces.md §6.3), one round:

1. **Upload.** Each replica writes ``<run>/round/<r>/delta/<rank>.safetensors`` create-only, with its
   digest (:mod:`.digest`: BLAKE3), ``rank`` and ``weight`` in the object metadata. Retries are
   idempotent and a zombie
   replica cannot overwrite its own earlier upload.
2. **Validate.** Each replica downloads the uploads it sees and checks the digest, the file's
   structure, the tensor names, shapes and dtypes against its own, and that every value is finite.
   An invalid upload is never proposed for a manifest.
3. **Manifest = the consensus point.** When every replica's upload is valid, or when this replica's
   deadline passes with at least ``min_participants`` valid uploads, it tries to create
   ``<run>/round/<r>/MANIFEST.json`` listing the ranks (sorted) and their digests. Exactly one writer
   wins; everyone else reads the winner's manifest.
4. **Reduce.** Every replica averages exactly the manifest's uploads (bytes checked against the
   manifest's digest), in rank order, accumulating in float64. Same bytes, same order, same
   arithmetic: every replica gets a **bit-identical** result.

A replica that is late, dead or corrupted is simply absent from the manifest; a late one reads the
manifest, learns that it was excluded (``AllReduceResult.included`` is ``False``) and adopts the result.

Cost (docs/benchmarks/diloco.md): each object is hashed once, while it streams in (or, for this
replica's own upload, straight from the tensors' memory); it is never copied after the download
(:mod:`.tensorfile` reads tensors as views on the downloaded buffer); the upload and the downloads
run concurrently in a small thread pool; the mean runs over cache-sized slices.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from composer_replication.diloco.serverless import digest, tensorfile
from composer_replication.diloco.serverless.mean import fixed_order_mean, upload_weight
from composer_replication.diloco.serverless.store import ObjectStore
from composer_replication.diloco.serverless.stream_mean import fusable, stream_mean

__all__ = [
    "AllReduceResult",
    "AllReduceError",
    "object_store_allreduce",
    "fixed_order_mean",
    "round_prefix",
    "read_object",
    "put_tensors",
    "get_tensors",
]

MANIFEST = "MANIFEST.json"
_READ_CHUNK = 4 << 20  # bytes per read: hashed while still in cache
_WORKERS = 4


class AllReduceError(RuntimeError):
    """The round could not complete (no quorum before the timeout, or a manifest entry is unreadable)."""


@dataclass
class AllReduceResult:
    """The reduced tensors and how the round went, as seen by one replica."""

    tensors: dict[str, torch.Tensor]
    participants: list[int]
    included: bool
    round: int
    rejected: dict[int, str] = field(default_factory=dict)
    manifest_writer: int | None = None
    seconds: float = 0.0
    streamed: bool = False  # averaged while streaming (the last replica to arrive; see .stream_mean)


def round_prefix(run_id: str, round_index: int) -> str:
    return f"{run_id}/round/{round_index:06d}"


def read_object(store: ObjectStore, key: str) -> tuple[Any, dict[str, str], str]:
    """``(content, metadata, "<algorithm>:<hex>")`` of ``key``, hashed while it streams into one buffer.

    The content is a writable buffer (an uninitialised numpy array: no pass to zero it first).
    """
    opener = getattr(store, "open_read", None)
    if opener is None:  # a store with only the basic protocol
        data, meta = store.get(key)
        algorithm = digest.expected(meta)[0]
        return bytearray(data), meta, f"{algorithm}:{digest.new(algorithm, data).hexdigest()}"
    stream, size, meta = opener(key)
    algorithm = digest.expected(meta)[0]
    buf, h, pos = np.empty(size, dtype=np.uint8), digest.new(algorithm), 0
    view = buf.data
    with stream:
        while pos < size:
            n = stream.readinto(view[pos : min(pos + _READ_CHUNK, size)])
            if not n:  # the transfer, not the upload, is at fault: fail like any broken download
                raise OSError(f"{key}: the read ended after {pos} of {size} bytes on {store.describe()}")
            h.update(view[pos : pos + n])
            pos += n
        stream.readinto(bytearray(1))  # at the end: lets the client check and reuse the connection
    return buf, meta, f"{algorithm}:{h.hexdigest()}"


def _validate(
    data: Any,
    meta: Mapping[str, str],
    sha: str,
    like: Mapping[str, torch.Tensor],
    expect_sha: str | None = None,
) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Check one upload; ``(tensors, "")`` if good (views on ``data``), ``(None, reason)`` if not."""
    algorithm, declared = digest.expected(meta)
    if f"{algorithm}:{declared}" != sha:
        return (
            None,
            f"{algorithm} mismatch (metadata {meta.get(algorithm)!r}, content {sha.partition(':')[2]})",
        )
    if expect_sha is not None and sha != expect_sha:
        return None, f"content digest {sha} differs from the manifest's {expect_sha}"
    try:
        tensors = tensorfile.decode(data)
    except ValueError as exc:  # a malformed file is a rejected upload, not a crash
        return None, f"not a safetensors file: {exc}"
    if sorted(tensors) != sorted(like):
        return None, f"tensor names differ: {sorted(set(tensors) ^ set(like))[:5]}"
    for name, t in tensors.items():
        ref = like[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            return None, f"{name}: {tuple(t.shape)}/{t.dtype}, expected {tuple(ref.shape)}/{ref.dtype}"
        if not tensorfile.finite(t):
            return None, f"{name}: non-finite values"
    return tensors, ""


def _fetch(
    store: ObjectStore, key: str, like: Mapping[str, torch.Tensor], expect_sha: str | None = None
) -> tuple[dict[str, torch.Tensor] | None, str, dict[str, str]]:
    data, meta, sha = read_object(store, key)
    parsed, why = _validate(data, meta, sha, like, expect_sha)
    return parsed, why, {**meta, "digest": sha}


def put_tensors(
    store: ObjectStore,
    key: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> tuple[bool, str]:
    """Create ``key`` as the safetensors file of ``tensors`` (no copy on a streaming store), its digest
    in the metadata: ``(created, "<algorithm>:<hex>")``."""
    parts = tensorfile.encode(tensors)
    h = digest.new(digest.WRITE)
    for part in parts:
        h.update(part)
    meta = {**(metadata or {}), digest.WRITE: h.hexdigest()}
    put_parts = getattr(store, "put_parts_if_absent", None)
    if put_parts is not None:
        created = put_parts(key, parts, metadata=meta)
    else:
        created = store.put_if_absent(key, b"".join(parts), metadata=meta)
    return created, f"{digest.WRITE}:{meta[digest.WRITE]}"


def get_tensors(store: ObjectStore, key: str) -> dict[str, torch.Tensor]:
    """The tensors of ``key`` (written by :func:`put_tensors`); ``ValueError`` if its digest or
    structure is wrong, ``KeyError`` if it does not exist."""
    data, meta, found = read_object(store, key)
    algorithm, declared = digest.expected(meta)
    if found != f"{algorithm}:{declared}":
        raise ValueError(
            f"{key} on {store.describe()}: {algorithm} mismatch (metadata {declared!r}, content {found})"
        )
    try:
        return tensorfile.decode(data)
    except ValueError as exc:
        raise ValueError(f"{key} on {store.describe()}: not a safetensors file: {exc}") from None


def _upload(
    store: ObjectStore, key: str, like: Mapping[str, torch.Tensor], rank: int, weight: float
) -> tuple[bool, str, bool]:
    """Create this replica's upload: ``(created, "<algorithm>:<hex>", finite)``."""
    finite = all(tensorfile.finite(t) for t in like.values())
    created, found = put_tensors(store, key, like, {"rank": str(rank), "weight": repr(float(weight))})
    return created, found, finite


def _read_manifest(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.get(f"{prefix}/{MANIFEST}")[0])
    except KeyError:
        return None


def _rank_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".", 1)[0])


def _propose(store: ObjectStore, prefix: str, proposal: dict[str, Any]) -> dict[str, Any]:
    """Try to create the manifest; the manifest that exists afterwards (ours or the winner's)."""
    body = json.dumps(proposal, sort_keys=True).encode()
    if store.put_if_absent(
        f"{prefix}/{MANIFEST}", body, metadata={"sha256": hashlib.sha256(body).hexdigest()}
    ):
        return proposal
    manifest = _read_manifest(store, prefix)
    assert manifest is not None, "a create-only write lost to a manifest that does not exist"
    return manifest


def _fast_round(
    store: ObjectStore,
    prefix: str,
    like: Mapping[str, torch.Tensor],
    own: Future,
    *,
    rank: int,
    world_size: int,
    weight: float,
    round_index: int,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
    """The last replica to arrive: stream the others' uploads and average them on the way in.

    Returns ``(mean, manifest)``; ``mean`` is None when the general path must take over (someone
    missing, an upload it must judge, or a manifest listing something else).
    """
    keys = {
        r: key
        for key in store.list(f"{prefix}/delta/")
        if (r := _rank_of(key)) != rank and 0 <= r < world_size
    }
    if len(keys) != world_size - 1:
        return None, None
    streamed = stream_mean(store, keys, like, rank=rank, weight=weight)
    created, sha, finite = own.result()
    if streamed.mean is None or not (created and finite):
        return None, None
    ranks = sorted([rank, *keys])
    digests = {**streamed.digests, rank: sha}
    manifest = _propose(
        store,
        prefix,
        {
            "round": round_index,
            "participants": ranks,
            "digests": {str(r): digests[r] for r in ranks},
            "weights": {str(r): streamed.weights[r] for r in ranks},
            "rejected": {},
            "writer": rank,
        },
    )
    same = manifest["participants"] == ranks and all(
        manifest["digests"][str(r)] == digests[r]
        and float(manifest["weights"][str(r)]) == streamed.weights[r]
        for r in ranks
    )
    return (streamed.mean if same else None), manifest


def object_store_allreduce(
    store: ObjectStore,
    tensors: Mapping[str, torch.Tensor],
    *,
    run_id: str,
    round_index: int,
    rank: int,
    world_size: int,
    weight: float = 1.0,
    min_participants: int = 1,
    deadline_s: float = 60.0,
    timeout_s: float = 600.0,
    poll_interval_s: float = 0.05,
    upload: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> AllReduceResult:
    """Average ``tensors`` with whichever replicas make this round; see the module docstring.

    Args:
        store: a create-only object store (:mod:`.store`), shared by all replicas.
        tensors: this replica's contribution (e.g. a pseudo-gradient), name -> tensor.
        run_id, round_index: the key space of the round; every replica must use the same values.
        rank, world_size: this replica and how many are expected.
        weight: this replica's weight in the mean (e.g. tokens processed); 1.0 = a plain mean.
        min_participants: after the deadline, the fewest valid uploads a manifest may list.
        deadline_s: grace period (from this call) before a manifest is written without everyone.
        timeout_s: give up (``AllReduceError``) if no manifest exists after this long.
        upload: ``False`` to only wait for and adopt the round's result (a replica rejoining late).

    Returns:
        The mean over the manifest's participants, identical on every replica, and whether this
        replica's own upload was part of it.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if not 1 <= min_participants <= world_size:
        raise ValueError(f"min_participants={min_participants} must be in [1, world_size={world_size}]")
    start = clock()
    prefix = round_prefix(run_id, round_index)
    like = {k: t.detach().cpu() for k, t in tensors.items()}
    valid: dict[int, tuple[dict[str, torch.Tensor], str, float]] = {}
    rejected: dict[int, str] = {}
    mean: dict[str, torch.Tensor] | None = None
    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="allreduce") as pool:
        # our upload and the downloads of the others' run at the same time
        own: Future | None = None
        if upload:
            own = pool.submit(_upload, store, f"{prefix}/delta/{rank:05d}.safetensors", like, rank, weight)
        manifest = _read_manifest(store, prefix)
        if manifest is None and own is not None and world_size > 1 and fusable(like):
            mean, manifest = _fast_round(
                store,
                prefix,
                like,
                own,
                rank=rank,
                world_size=world_size,
                weight=weight,
                round_index=round_index,
            )
        while manifest is None and (manifest := _read_manifest(store, prefix)) is None:
            fetches: dict[int, Future] = {}
            for key in store.list(f"{prefix}/delta/"):
                r = _rank_of(key)
                if r in valid or r in rejected or not 0 <= r < world_size or (r == rank and own is not None):
                    continue  # known, out of range, or our own upload still in flight
                fetches[r] = pool.submit(_fetch, store, key, like)
            if own is not None:
                created, sha, finite = own.result()
                own = None
                if created and finite:  # no need to download it again (a retry re-reads what won)
                    valid[rank] = (like, sha, float(weight))
            for r, fut in fetches.items():  # every upload seen is judged before deciding, as one pass
                parsed, why, meta = fut.result()
                if parsed is None:
                    rejected[r] = why
                elif (w := upload_weight(meta)) is None:
                    rejected[r] = f"weight {meta.get('weight')!r} is not a finite positive number"
                else:
                    valid[r] = (parsed, meta["digest"], w)
            now = clock() - start
            if len(valid) == world_size or (now >= deadline_s and len(valid) >= min_participants):
                ranks = sorted(valid)
                manifest = _propose(
                    store,
                    prefix,
                    {
                        "round": round_index,
                        "participants": ranks,
                        "digests": {str(r): valid[r][1] for r in ranks},
                        "weights": {str(r): valid[r][2] for r in ranks},
                        "rejected": {str(r): why for r, why in sorted(rejected.items())},
                        "writer": rank,
                    },
                )
                break
            if now >= timeout_s:
                raise AllReduceError(
                    f"round {round_index} of {run_id!r}: no manifest after {timeout_s:.0f}s; "
                    f"{len(valid)} valid uploads (need {min_participants}), rejected {rejected} "
                    f"on {store.describe()}"
                )
            time.sleep(poll_interval_s)
        if own is not None:
            own.result()  # a manifest already existed; our upload still ends (and is excluded)

        contributions: dict[int, dict[str, torch.Tensor]] = {}
        refetch: dict[int, Future] = {}
        for r in manifest["participants"] if mean is None else []:
            want = manifest["digests"][str(r)]
            if r in valid and valid[r][1] == want:
                contributions[r] = valid[r][0]
            else:  # we had not seen (or had rejected) what the manifest's writer accepted: fetch it again
                key = f"{prefix}/delta/{r:05d}.safetensors"
                refetch[r] = pool.submit(_fetch, store, key, like, want)
        for r, fut in refetch.items():
            parsed, why, _ = fut.result()
            if parsed is None:
                raise AllReduceError(f"round {round_index}: manifest entry for rank {r} is unusable: {why}")
            contributions[r] = parsed
    streamed = mean is not None
    if mean is None:
        weights = {r: float(manifest["weights"][str(r)]) for r in manifest["participants"]}
        mean = fixed_order_mean(contributions, weights)
    rejected.update({int(r): why for r, why in manifest.get("rejected", {}).items()})
    return AllReduceResult(
        tensors=mean,
        participants=list(manifest["participants"]),
        included=rank in manifest["participants"],
        round=round_index,
        rejected=rejected,
        manifest_writer=manifest.get("writer"),
        seconds=clock() - start,
        streamed=streamed,
    )
