"""A DiLoCo replica synchronised through an object store, for replicas that cannot reach each other.

Each round: adopt the newest published global state if this replica is behind (restarted, or late),
else load the global parameters, run the inner loop, all-reduce the pseudo-gradient through the
store (:func:`~composer_replication.diloco.serverless.allreduce.object_store_allreduce`), take the
outer step, and publish the new global state (parameters + outer momentum) create-only under
``<run>/state/<round>.safetensors`` with its digest (the first replica to get there uploads it; a
replica that adopts a state checks the digest). Works on every backend (local, Modal, HF Jobs,
SageMaker, EKS).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from composer_replication.config.replica import ReplicaConfig
from composer_replication.diloco.inner import build_inner
from composer_replication.diloco.outer import OuterOptimizer, params_sha256, pseudo_gradient

__all__ = ["run_store_replica", "latest_state", "publish_state", "state_key"]


def state_key(run_id: str, round_index: int) -> str:
    """Where the global state after ``round_index`` is published."""
    return f"{run_id}/state/{round_index:06d}.safetensors"


def latest_state(store: Any, run_id: str, at_least: int) -> tuple[int, dict[str, torch.Tensor]] | None:
    """The newest published global state if it is for round ``at_least`` or later (else None)."""
    from composer_replication.diloco.serverless.allreduce import get_tensors

    keys = store.list(f"{run_id}/state/")
    if not keys:
        return None
    newest = int(keys[-1].rsplit("/", 1)[1].split(".")[0])
    if newest < at_least:
        return None
    return newest, get_tensors(store, keys[-1])


def publish_state(store: Any, key: str, tensors: dict[str, torch.Tensor]) -> None:
    """Publish a round's global state create-only, unless another replica already has (every replica
    holds the same bits, so one copy is enough and the others skip the upload)."""
    from composer_replication.diloco.serverless.allreduce import put_tensors

    if key not in store.list(key):
        put_tensors(store, key, tensors)


def run_store_replica(
    cfg: ReplicaConfig, *, rank: int, world_size: int, log: Callable[..., None]
) -> dict[str, Any]:
    """Run ``cfg.rounds`` outer rounds over ``cfg.store``; log a ``sync`` row per round."""
    from composer_replication.diloco.serverless.allreduce import object_store_allreduce
    from composer_replication.diloco.serverless.factory import make_store

    if cfg.store is None:
        raise ValueError("sync: object_store needs a `store` ({type: local, root: ...} or {type: s3, ...})")
    store = make_store(cfg.store.model_dump())
    inner = build_inner(cfg, rank=rank, world_size=world_size)
    model = inner.model
    outer = OuterOptimizer(
        dict(model.named_parameters()), lr=cfg.outer_lr, momentum=cfg.outer_momentum, nesterov=cfg.nesterov
    )
    history: list[dict[str, Any]] = []
    r = 0
    while r < cfg.rounds:
        latest = latest_state(store, cfg.run_id, at_least=r)
        if latest is not None:  # restarted or behind: adopt the newest global state
            outer.load_state_tensors(latest[1])
            log(event="adopt", round=latest[0], param_sha256=params_sha256(outer.params))
            r = latest[0] + 1
            continue
        outer.load_into(model)
        out = inner.run_round(r)
        res = object_store_allreduce(
            store,
            pseudo_gradient(outer.params, model),
            run_id=cfg.run_id,
            round_index=r,
            rank=rank,
            world_size=world_size,
            min_participants=cfg.min_participants,
            deadline_s=cfg.deadline_s,
            timeout_s=cfg.timeout_s,
        )
        outer.step(res.tensors)
        publish_state(store, state_key(cfg.run_id, r), outer.state_tensors())
        row = {
            "round": r,
            "loss": out["loss"],
            **({"metrics": out["metrics"]} if "metrics" in out else {}),
            "participants": res.participants,
            "included": res.included,
            "rejected": {str(k): v for k, v in res.rejected.items()},
            "allreduce_s": round(res.seconds, 4),
            "param_sha256": params_sha256(outer.params),
        }
        log(event="sync", step=(r + 1) * cfg.inner_steps, **row)
        history.append(row)
        r += 1
    outer.load_into(model)
    return {"rank": rank, "rounds": history, "param_sha256": params_sha256(outer.params)}
