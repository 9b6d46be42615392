"""What one DiLoCo replica runs, on any backend: config in; inner rounds and outer syncs; logs out.

:func:`run_replica` validates the config, pins the intra-op threads, logs a ``start`` record, hands
the rounds to the sync module of ``cfg.sync`` (:mod:`.sync_store` for ``object_store``,
:mod:`.sync_torchft` for ``torchft``), logs ``done`` and writes ``replica-<rank>.result.json``.
Records are JSON lines on stdout (what the launcher tails) and, with a ``run_dir``, appended to
``replica-<rank>.metrics.jsonl``. The command-line wrapper is
:mod:`composer_replication.diloco.serverless.replica_entrypoint`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from composer_replication.config.replica import ReplicaConfig, parse_replica_config

__all__ = ["run_replica", "ReplicaLog"]


class ReplicaLog:
    """Append-only JSONL metrics in ``run_dir`` and a JSON line on stdout per record."""

    def __init__(self, run_dir: str | None, rank: int) -> None:
        from composer_replication._io import JsonlAppender

        self.rank = rank
        self.dir = Path(run_dir) if run_dir else None
        self.metrics = JsonlAppender(self.dir / f"replica-{rank}.metrics.jsonl") if self.dir else None

    def __call__(self, **record: Any) -> None:
        record = {"rank": self.rank, "time": round(time.time(), 3), **record}
        print(json.dumps(record), flush=True)
        if self.metrics is not None:
            self.metrics.write(record)


def run_replica(config: Mapping[str, Any] | ReplicaConfig, *, rank: int, world_size: int) -> dict[str, Any]:
    """Run one replica to completion and return a JSON-able summary (also written to ``run_dir``)."""
    import torch

    cfg = parse_replica_config(config)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    torch.set_num_threads(cfg.num_threads)
    log = ReplicaLog(cfg.run_dir, rank)
    log(event="start", world_size=world_size, sync=cfg.sync, pid=os.getpid())
    if cfg.sync == "torchft":
        from composer_replication.diloco.sync_torchft import run_torchft_replica

        result = run_torchft_replica(cfg, rank=rank, world_size=world_size, log=log)
    else:
        from composer_replication.diloco.sync_store import run_store_replica

        result = run_store_replica(cfg, rank=rank, world_size=world_size, log=log)
    log(event="done", param_sha256=result["param_sha256"])
    if cfg.run_dir:
        from composer_replication._io import atomic_write_json

        atomic_write_json(Path(cfg.run_dir) / f"replica-{rank}.result.json", result)
    return result
