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

import torch

from composer_replication.diloco.serverless import tensorfile
from composer_replication.diloco.serverless.mean import fixed_order_mean, upload_weight
from composer_replication.diloco.serverless.objects import (
    fetch_upload,
    get_tensors,
    put_tensors,
    read_object,
)
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


class _Round:
    """One replica's view of one round: the uploads it has judged, and the steps that move it on.

    ``valid`` maps a rank to ``(tensors, digest, weight)``; ``rejected`` a rank to the reason. The
    steps, in the order :func:`object_store_allreduce` runs them: :meth:`start_upload`, then either
    :meth:`fast_path` (the last replica to arrive) or :meth:`collect` until :meth:`decide` returns a
    manifest, then :meth:`contributions` and :meth:`mean` of exactly what it lists.
    """

    def __init__(
        self, store: ObjectStore, pool: ThreadPoolExecutor, like: dict[str, torch.Tensor], *,
        run_id: str, round_index: int, rank: int, world_size: int, weight: float,
    ) -> None:  # fmt: skip
        self.store, self.pool, self.like = store, pool, like
        self.run_id, self.round_index = run_id, round_index
        self.rank, self.world_size, self.weight = rank, world_size, weight
        self.prefix = round_prefix(run_id, round_index)
        self.valid: dict[int, tuple[dict[str, torch.Tensor], str, float]] = {}
        self.rejected: dict[int, str] = {}
        self.own: Future | None = None  # this replica's upload while it is in flight

    def key(self, rank: int) -> str:
        return f"{self.prefix}/delta/{rank:05d}.safetensors"

    def start_upload(self) -> None:
        """Upload this replica's tensors in the background; the downloads run meanwhile."""
        self.own = self.pool.submit(
            _upload, self.store, self.key(self.rank), self.like, self.rank, self.weight
        )

    def manifest(self) -> dict[str, Any] | None:
        return _read_manifest(self.store, self.prefix)

    def proposal(
        self, ranks: list[int], digests: Mapping[int, str], weights: Mapping[int, float]
    ) -> dict[str, Any]:
        return {
            "round": self.round_index,
            "participants": ranks,
            "digests": {str(r): digests[r] for r in ranks},
            "weights": {str(r): weights[r] for r in ranks},
            "rejected": {str(r): why for r, why in sorted(self.rejected.items())},
            "writer": self.rank,
        }

    def fast_path(self) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
        """The last replica to arrive: stream the others' uploads and average them on the way in.

        Returns ``(mean, manifest)``; ``mean`` is None when the general path must take over (someone
        missing, an upload it must judge, or a manifest listing something else).
        """
        if self.own is None or self.world_size == 1 or not fusable(self.like):
            return None, None
        keys = {
            r: key
            for key in self.store.list(f"{self.prefix}/delta/")
            if (r := _rank_of(key)) != self.rank and 0 <= r < self.world_size
        }
        if len(keys) != self.world_size - 1:
            return None, None
        streamed = stream_mean(self.store, keys, self.like, rank=self.rank, weight=self.weight)
        created, sha, finite = self.own.result()
        if streamed.mean is None or not (created and finite):
            return None, None
        ranks = sorted([self.rank, *keys])
        digests = {**streamed.digests, self.rank: sha}
        manifest = _propose(self.store, self.prefix, self.proposal(ranks, digests, streamed.weights))
        same = manifest["participants"] == ranks and all(
            manifest["digests"][str(r)] == digests[r]
            and float(manifest["weights"][str(r)]) == streamed.weights[r]
            for r in ranks
        )
        return (streamed.mean if same else None), manifest

    def collect(self) -> None:
        """One pass: judge every upload not judged yet (all of them before deciding anything)."""
        fetches: dict[int, Future] = {}
        for key in self.store.list(f"{self.prefix}/delta/"):
            r = _rank_of(key)
            known = r in self.valid or r in self.rejected
            if known or not 0 <= r < self.world_size or (r == self.rank and self.own is not None):
                continue  # known, out of range, or our own upload still in flight
            fetches[r] = self.pool.submit(fetch_upload, self.store, key, self.like)
        self.settle_own()
        for r, fut in fetches.items():
            parsed, why, meta = fut.result()
            if parsed is None:
                self.rejected[r] = why
            elif (w := upload_weight(meta)) is None:
                self.rejected[r] = f"weight {meta.get('weight')!r} is not a finite positive number"
            else:
                self.valid[r] = (parsed, meta["digest"], w)

    def settle_own(self) -> None:
        """Wait for this replica's upload; a good one counts without downloading it again."""
        if self.own is None:
            return
        created, sha, finite = self.own.result()
        self.own = None
        if created and finite:  # a retry that lost re-reads what won, like anyone else's
            self.valid[self.rank] = (self.like, sha, float(self.weight))

    def decide(self, elapsed: float, *, deadline_s: float, min_participants: int) -> dict[str, Any] | None:
        """Propose a manifest once everyone is in, or after the deadline with enough; None: not yet."""
        if len(self.valid) < self.world_size and (elapsed < deadline_s or len(self.valid) < min_participants):
            return None
        ranks = sorted(self.valid)
        digests = {r: v[1] for r, v in self.valid.items()}
        weights = {r: v[2] for r, v in self.valid.items()}
        return _propose(self.store, self.prefix, self.proposal(ranks, digests, weights))

    def timed_out(self, timeout_s: float, min_participants: int) -> AllReduceError:
        return AllReduceError(
            f"round {self.round_index} of {self.run_id!r}: no manifest after {timeout_s:.0f}s; "
            f"{len(self.valid)} valid uploads (need {min_participants}), rejected {self.rejected} "
            f"on {self.store.describe()}"
        )

    def contributions(self, manifest: Mapping[str, Any]) -> dict[int, dict[str, torch.Tensor]]:
        """The manifest's uploads: ours as judged, the rest (unseen or judged otherwise) fetched again."""
        out: dict[int, dict[str, torch.Tensor]] = {}
        refetch: dict[int, Future] = {}
        for r in manifest["participants"]:
            want = manifest["digests"][str(r)]
            if r in self.valid and self.valid[r][1] == want:
                out[r] = self.valid[r][0]
            else:
                refetch[r] = self.pool.submit(fetch_upload, self.store, self.key(r), self.like, want)
        for r, fut in refetch.items():
            parsed, why, _ = fut.result()
            if parsed is None:
                raise AllReduceError(
                    f"round {self.round_index}: manifest entry for rank {r} is unusable: {why}"
                )
            out[r] = parsed
        return out


def _await_manifest(
    rnd: _Round, clock: Callable[[], float], start: float, *,
    deadline_s: float, timeout_s: float, min_participants: int, poll_interval_s: float,
) -> dict[str, Any]:  # fmt: skip
    """Judge uploads until a manifest exists (ours or another replica's)."""
    while (manifest := rnd.manifest()) is None:
        rnd.collect()
        elapsed = clock() - start
        manifest = rnd.decide(elapsed, deadline_s=deadline_s, min_participants=min_participants)
        if manifest is not None:
            return manifest
        if elapsed >= timeout_s:
            raise rnd.timed_out(timeout_s, min_participants)
        time.sleep(poll_interval_s)
    return manifest


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
    like = {k: t.detach().cpu() for k, t in tensors.items()}
    with ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="allreduce") as pool:
        rnd = _Round(store, pool, like, run_id=run_id, round_index=round_index, rank=rank,
                     world_size=world_size, weight=weight)  # fmt: skip
        if upload:
            rnd.start_upload()
        mean, manifest = None, rnd.manifest()
        if manifest is None:
            mean, manifest = rnd.fast_path()
        if manifest is None:
            manifest = _await_manifest(rnd, clock, start, deadline_s=deadline_s, timeout_s=timeout_s,
                                       min_participants=min_participants, poll_interval_s=poll_interval_s)  # fmt: skip
        if rnd.own is not None:
            rnd.own.result()  # a manifest already existed; our upload still ends (and is excluded)
        contributions = rnd.contributions(manifest) if mean is None else {}
    streamed = mean is not None
    if mean is None:
        weights = {r: float(manifest["weights"][str(r)]) for r in manifest["participants"]}
        mean = fixed_order_mean(contributions, weights)
    rejected = {**rnd.rejected, **{int(r): why for r, why in manifest.get("rejected", {}).items()}}
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
