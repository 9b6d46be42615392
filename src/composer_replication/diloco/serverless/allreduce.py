"""A fault-tolerant all-reduce (mean) through an object store, for replicas that cannot reach each other.

The leaderless manifest protocol (design notes: interfaces.md §6.3), one round:

1. **Upload.** Each replica writes ``<run>/round/<r>/delta/<rank>.safetensors`` create-only, with its
   ``sha256``, ``rank`` and ``weight`` in the object metadata. Retries are idempotent and a zombie
   replica cannot overwrite its own earlier upload.
2. **Validate.** Each replica downloads the uploads it sees and checks the sha256, the tensor names,
   shapes and dtypes against its own, and that every value is finite. An invalid upload is never
   proposed for a manifest.
3. **Manifest = the consensus point.** When every replica's upload is valid, or when this replica's
   deadline passes with at least ``min_participants`` valid uploads, it tries to create
   ``<run>/round/<r>/MANIFEST.json`` listing the ranks (sorted) and their sha256s. Exactly one writer
   wins; everyone else reads the winner's manifest.
4. **Reduce.** Every replica averages exactly the manifest's uploads (bytes checked against the
   manifest's sha256), in rank order, accumulating in float64. Same bytes, same order, same
   arithmetic: every replica gets a **bit-identical** result.

A replica that is late, dead or corrupted is simply absent from the manifest; a late one reads the
manifest, learns that it was excluded (``AllReduceResult.included`` is ``False``) and adopts the result.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from composer_replication.diloco.serverless.store import ObjectStore

__all__ = ["AllReduceResult", "AllReduceError", "object_store_allreduce", "fixed_order_mean", "round_prefix"]

MANIFEST = "MANIFEST.json"


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


def round_prefix(run_id: str, round_index: int) -> str:
    return f"{run_id}/round/{round_index:06d}"


def _serialize(tensors: Mapping[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: t.detach().contiguous().cpu() for k, t in sorted(tensors.items())})


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fixed_order_mean(
    contributions: Mapping[int, Mapping[str, torch.Tensor]], weights: Mapping[int, float] | None = None
) -> dict[str, torch.Tensor]:
    """Weighted mean of per-rank tensor dicts, in ascending rank order, accumulated in float64.

    Pure and deterministic: the reference that every replica (and the single-process simulation)
    computes identically. The result has each tensor's original dtype.
    """
    ranks = sorted(contributions)
    if not ranks:
        raise ValueError("fixed_order_mean needs at least one contribution")
    w = {r: float(weights[r]) if weights else 1.0 for r in ranks}
    total = sum(w[r] for r in ranks)
    first = contributions[ranks[0]]
    out: dict[str, torch.Tensor] = {}
    for name in sorted(first):
        acc = torch.zeros(first[name].shape, dtype=torch.float64)
        for r in ranks:  # in-place mixed-dtype add: computed in float64, no float64 copy of the input
            acc.add_(contributions[r][name], alpha=w[r])
        out[name] = acc.div_(total).to(first[name].dtype)
    return out


def _finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t``: one float64 sum (NaN/inf propagate; finite fp32 values cannot overflow it)."""
    return not t.is_floating_point() or math.isfinite(float(t.sum(dtype=torch.float64)))


def _fetch(store: ObjectStore, key: str, like: Mapping[str, torch.Tensor]):
    blob, meta = store.get(key)
    parsed, why = _validate(blob, meta, like)
    return parsed, why, meta


def _validate(
    data: bytes, meta: Mapping[str, str], like: Mapping[str, torch.Tensor], expect_sha: str | None = None
) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Parse and check one upload; ``(tensors, "")`` if good, ``(None, reason)`` if not."""
    from safetensors.torch import load

    sha = _sha256(data)
    if meta.get("sha256") != sha:
        return None, f"sha256 mismatch (metadata {meta.get('sha256')!r}, content {sha})"
    if expect_sha is not None and sha != expect_sha:
        return None, f"content sha256 {sha} differs from the manifest's {expect_sha}"
    try:
        tensors = load(data)
    except Exception as exc:  # a malformed file is a rejected upload, not a crash
        return None, f"not a safetensors file: {exc}"
    if sorted(tensors) != sorted(like):
        return None, f"tensor names differ: {sorted(set(tensors) ^ set(like))[:5]}"
    for name, t in tensors.items():
        ref = like[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            return None, f"{name}: {tuple(t.shape)}/{t.dtype}, expected {tuple(ref.shape)}/{ref.dtype}"
        if not _finite(t):
            return None, f"{name}: non-finite values"
    return tensors, ""


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
    if upload:
        data = _serialize(like)
        meta = {"sha256": _sha256(data), "rank": str(rank), "weight": repr(float(weight))}
        finite = all(_finite(t) for t in like.values())
        created = store.put_if_absent(f"{prefix}/delta/{rank:05d}.safetensors", data, metadata=meta)
        if created and finite:
            # our own upload: no need to download it again (a retry re-reads whatever won, below)
            valid[rank] = (like, meta["sha256"], float(weight))
        del data
    rejected: dict[int, str] = {}
    manifest: dict | None = None
    writer: int | None = None
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="allreduce-get") as pool:
        while manifest is None:
            try:
                manifest = json.loads(store.get(f"{prefix}/{MANIFEST}")[0])
                break
            except KeyError:
                pass
            new = {}
            for key in store.list(f"{prefix}/delta/"):
                r = int(key.rsplit("/", 1)[1].split(".", 1)[0])
                if r not in valid and r not in rejected and 0 <= r < world_size:
                    new[r] = key
            # fetch and check the new uploads concurrently: GETs wait on the network, and sha256 and
            # the torch checks release the GIL
            for r, (parsed, why, m) in zip(new, pool.map(lambda k: _fetch(store, k, like), new.values())):
                if parsed is None:
                    rejected[r] = why
                else:
                    valid[r] = (parsed, m["sha256"], float(m.get("weight", "1.0")))
            now = clock() - start
            if len(valid) == world_size or (now >= deadline_s and len(valid) >= min_participants):
                ranks = sorted(valid)
                proposal = {
                    "round": round_index,
                    "participants": ranks,
                    "sha256": {str(r): valid[r][1] for r in ranks},
                    "weights": {str(r): valid[r][2] for r in ranks},
                    "rejected": {str(r): why for r, why in sorted(rejected.items())},
                    "writer": rank,
                }
                body = json.dumps(proposal, sort_keys=True).encode()
                if store.put_if_absent(f"{prefix}/{MANIFEST}", body, metadata={"sha256": _sha256(body)}):
                    manifest = proposal
                continue  # lost the race (or won): read the winner on the next pass
            if now >= timeout_s:
                raise AllReduceError(
                    f"round {round_index} of {run_id!r}: no manifest after {timeout_s:.0f}s; "
                    f"{len(valid)} valid uploads (need {min_participants}), rejected {rejected} "
                    f"on {store.describe()}"
                )
            time.sleep(poll_interval_s)

    writer = manifest.get("writer")
    contributions: dict[int, dict[str, torch.Tensor]] = {}
    weights: dict[int, float] = {}
    for r in manifest["participants"]:
        want = manifest["sha256"][str(r)]
        if r in valid and valid[r][1] == want:
            contributions[r] = valid[r][0]
        else:  # we had not seen (or had rejected) what the manifest's writer accepted: fetch it again
            blob, m = store.get(f"{prefix}/delta/{r:05d}.safetensors")
            parsed, why = _validate(blob, m, like, expect_sha=want)
            if parsed is None:
                raise AllReduceError(f"round {round_index}: manifest entry for rank {r} is unusable: {why}")
            contributions[r] = parsed
        weights[r] = float(manifest["weights"][str(r)])
    mean = fixed_order_mean(contributions, weights)
    rejected.update({int(r): why for r, why in manifest.get("rejected", {}).items()})
    return AllReduceResult(
        tensors=mean,
        participants=list(manifest["participants"]),
        included=rank in manifest["participants"],
        round=round_index,
        rejected=rejected,
        manifest_writer=writer,
        seconds=clock() - start,
    )
