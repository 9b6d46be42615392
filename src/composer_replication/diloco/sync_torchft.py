"""A DiLoCo replica synchronised by torchft (lighthouse + Manager over gloo), for networked replicas.

Each replica is one replica group of size 1: it creates its own ``TCPStore`` (torchft's Manager only
connects to one), joins the lighthouse with a synchronous quorum, and runs the ``lm_ce`` inner loop
inside :func:`~composer_replication.diloco.make_diloco_outer_loop`. torchft handles membership: a
replica that dies drops out of the next quorum, and one that (re)starts heals from a live peer's
state (global parameters, outer momentum, inner optimiser) before its first sync.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from composer_replication.config.replica import ReplicaConfig
from composer_replication.diloco.inner import build_replica, inner_step
from composer_replication.diloco.outer import params_sha256
from composer_replication.diloco.synthetic import make_batch

__all__ = ["run_torchft_replica"]


def run_torchft_replica(
    cfg: ReplicaConfig, *, rank: int, world_size: int, log: Callable[..., None]
) -> dict[str, Any]:
    """Train until the manager has committed ``cfg.rounds`` outer steps; log a digest after each sync."""
    from torch.distributed import TCPStore
    from torchft.process_group import ProcessGroupGloo

    from composer_replication.diloco import Manager, make_diloco_outer_loop

    ft = cfg.torchft
    if ft is None:
        raise ValueError(
            "sync: torchft needs a `torchft` section with at least `lighthouse: http://HOST:PORT`"
        )
    model, inner_opt = build_replica(cfg)
    timeout = timedelta(seconds=ft.timeout_s)
    store = TCPStore(ft.hostname, 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner_optim": inner_opt.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner_opt.load_state_dict(sd["inner_optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=ft.min_replica_size,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timeout * 3,
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr=ft.hostname,
        store_port=store.port,
        lighthouse_addr=ft.lighthouse,
        hostname=ft.hostname,
        replica_id=f"{cfg.run_id}-replica{rank}",
    )
    history: list[dict[str, Any]] = []
    try:
        with make_diloco_outer_loop(
            manager,
            [model],
            inner_opt,
            outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum,
            nesterov=cfg.nesterov,
            sync_every=cfg.inner_steps,
        ):
            local_step = 0
            while manager.current_step() < cfg.rounds:
                batch = make_batch(
                    cfg, rank=rank, round_index=manager.current_step(), step=local_step % cfg.inner_steps
                )
                loss = inner_step(cfg, model, inner_opt, batch)
                local_step += 1
                if local_step % cfg.inner_steps == 0:  # the step hook has just synced
                    row = {
                        "round": manager.current_step(),
                        "loss": loss,
                        "participants": manager.num_participants(),
                        "param_sha256": params_sha256(model),
                    }
                    log(event="sync", step=local_step, **row)
                    history.append(row)
    finally:
        manager.shutdown(wait=False)
    return {"rank": rank, "rounds": history, "param_sha256": params_sha256(model)}
