"""The command line of one DiLoCo replica, as every backend starts it.

``python -m composer_replication.diloco.serverless.replica_entrypoint --config CONFIG --rank R
--world-size N`` (or ``--config-json '{...}'``). The rank falls back to ``$JOB_COMPLETION_INDEX``
(Kubernetes Indexed Jobs), then ``$REPLICA_RANK``, then ``$RANK``. The config is passed as a mapping
to ``--entrypoint`` (default :func:`composer_replication.diloco.replica.run_replica`), called as
``function(config, rank=R, world_size=N)``; ``--result-file`` also writes its JSON result.

``run_replica`` and ``ReplicaConfig`` are re-exported here, where the API reference (§12) names them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from composer_replication.config.replica import ReplicaConfig
from composer_replication.diloco.replica import run_replica

__all__ = ["ReplicaConfig", "run_replica", "env_rank", "main"]

RANK_VARIABLES = ("JOB_COMPLETION_INDEX", "REPLICA_RANK", "RANK")


def env_rank(environ: Any = os.environ) -> int | None:
    """The rank a backend put in the environment, if any (first of :data:`RANK_VARIABLES` that is set)."""
    for var in RANK_VARIABLES:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return None


def main(argv: list[str] | None = None) -> int:
    from composer_replication.diloco.serverless.executor import DEFAULT_ENTRYPOINT, resolve_entrypoint

    p = argparse.ArgumentParser(description="Run one DiLoCo replica.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="resolved config file: YAML, TOML or JSON")
    src.add_argument("--config-json", help="resolved config as an inline JSON string")
    p.add_argument(
        "--rank", type=int, default=None, help="default: " + ", ".join(f"${v}" for v in RANK_VARIABLES)
    )
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    p.add_argument("--result-file", help="write the JSON summary here too")
    p.add_argument(
        "--entrypoint",
        default=DEFAULT_ENTRYPOINT,
        help="'module:function' called as function(config, rank=, world_size=)",
    )
    args = p.parse_args(argv)
    if args.config:
        from composer_replication.config import read_config_file

        config = read_config_file(Path(args.config))
    else:
        config = json.loads(args.config_json)
    rank = args.rank if args.rank is not None else env_rank()
    if rank is None:
        p.error("no --rank and none of " + ", ".join(f"${v}" for v in RANK_VARIABLES) + " is set")
    result = resolve_entrypoint(args.entrypoint)(config, rank=rank, world_size=args.world_size)
    if args.result_file:
        from composer_replication._io import atomic_write_json

        atomic_write_json(args.result_file, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
