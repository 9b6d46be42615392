"""Processes of a distributed run: the launcher's environment, the rendezvous, and ``train --nproc N``.

- :func:`launch_env` reads what torchrun / ``accelerate launch`` set (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and names what is missing.
- :func:`init_process_group` waits for the rendezvous at most ``distributed.rendezvous_timeout_s``
  (a clear :class:`LaunchError` otherwise), then collectives time out after ``distributed.timeout_s``.
- :func:`run_local` is ``composer-replication train CONFIG --nproc N``: what ``torchrun --standalone
  --nproc-per-node N -m composer_replication.cli.main train ...`` does, from the CLI: a rendezvous on a
  free local port, one worker per device (:func:`check_nproc`: per GPU, or per CPU core on a machine
  without GPUs), no restarts (a failed worker stops the run; ``--resume`` continues from the last
  checkpoint). The workers train on the config as validated here (written to ``OUT/.nproc/config.json``),
  so every rank trains on the same settings. On CPU each worker gets ``OMP_NUM_THREADS = cores // N``
  unless the variable is set.

Every error here is raised before any model loads.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "LaunchError",
    "check_nproc",
    "init_process_group",
    "is_main_process",
    "launch_env",
    "run_local",
    "shutdown",
    "usable_devices",
]

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class LaunchError(ValueError):
    """A distributed launch that cannot work (one line, with the fix)."""


def usable_devices() -> tuple[int, str]:
    """(count, kind): CUDA devices, or on a machine without one the CPU cores this process may use."""
    if torch.cuda.is_available():
        return torch.cuda.device_count(), "CUDA device"
    return len(os.sched_getaffinity(0)), "usable CPU core"


def check_nproc(nproc: int) -> None:
    """At most one process per device: per GPU, or per CPU core on a machine without GPUs."""
    if nproc < 1:
        raise LaunchError(f"--nproc {nproc}: need at least 1 process")
    count, kind = usable_devices()
    if nproc > count:
        raise LaunchError(
            f"--nproc {nproc} is more than the {count} {kind}(s) here: one process per device "
            f"(on CPU, per core); use --nproc {count} or fewer"
        )


def launch_env(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The launcher's variables as ``{rank, world_size, local_rank, local_world_size, addr, port}``;
    None for a single process (``WORLD_SIZE`` unset or 1)."""
    env = os.environ if environ is None else environ
    world = env.get("WORLD_SIZE")
    if world in (None, "", "1"):
        return None
    missing = [v for v in LAUNCH_VARS if not env.get(v)]
    if missing:
        raise LaunchError(
            f"WORLD_SIZE={world} but {', '.join(missing)} not set: start the processes with torchrun "
            "(torchrun --nproc-per-node N -m composer_replication.cli.main train ...), accelerate launch, "
            "or `composer-replication train CONFIG --nproc N`"
        )
    try:
        out: dict[str, Any] = {
            "rank": int(env["RANK"]),
            "world_size": int(world),
            "local_rank": int(env["LOCAL_RANK"]),
            "local_world_size": int(env.get("LOCAL_WORLD_SIZE") or world),
            "addr": env["MASTER_ADDR"],
            "port": int(env["MASTER_PORT"]),
        }
    except ValueError as exc:
        raise LaunchError(f"launcher variables must be integers where numeric: {exc}") from None
    if not 0 <= out["rank"] < out["world_size"]:
        raise LaunchError(f"RANK={out['rank']} is outside WORLD_SIZE={out['world_size']}")
    return out


def _wait_reachable(addr: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((addr, port), timeout=min(2.0, timeout_s)):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"no rendezvous at MASTER_ADDR={addr} MASTER_PORT={port} after {timeout_s:g} s ({exc}): "
                    "is rank 0 (or the torchrun agent) running and reachable? "
                    "(distributed.rendezvous_timeout_s sets the wait)"
                ) from None
            time.sleep(0.2)


def init_process_group(env: dict[str, Any], d: Any, default_backend: str, device: Any) -> None:
    """Rendezvous within ``d.rendezvous_timeout_s`` (clear error otherwise), then collectives time out
    after ``d.timeout_s``. Under torchrun every rank joins the agent's store; otherwise rank 0 hosts it."""
    import torch.distributed as dist

    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    hosting = env["rank"] == 0 and not agent
    if not hosting:
        _wait_reachable(env["addr"], env["port"], d.rendezvous_timeout_s)
    backend = d.backend if d.backend != "auto" else default_backend
    try:
        store = dist.TCPStore(
            env["addr"], env["port"], env["world_size"] if hosting else None, is_master=hosting,
            timeout=timedelta(seconds=d.rendezvous_timeout_s), wait_for_workers=hosting,
        )  # fmt: skip
        prefix = f"composer_replication/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        dist.init_process_group(
            backend, store=dist.PrefixStore(prefix, store), rank=env["rank"], world_size=env["world_size"],
            timeout=timedelta(seconds=d.timeout_s), device_id=device,
        )  # fmt: skip
    except (RuntimeError, TimeoutError, dist.DistStoreError) as exc:
        raise LaunchError(
            f"rendezvous at {env['addr']}:{env['port']} failed for rank {env['rank']} of "
            f"{env['world_size']} within {d.rendezvous_timeout_s:g} s: {str(exc).splitlines()[0]} "
            "(are all processes started? distributed.rendezvous_timeout_s sets the wait)"
        ) from None


def is_main_process() -> bool:
    """Rank 0 of a launched run, or a single process."""
    env = launch_env()
    return env is None or env["rank"] == 0


def shutdown() -> None:
    """Leave the process group, if one was initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_local(cfg: Any, nproc: int, out: Path, worker_flags: list[str]) -> int:
    """Train ``cfg`` on ``nproc`` local processes writing to ``out``; the workers' exit code (0 on success)."""
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from composer_replication._io import atomic_write_json

    check_nproc(nproc)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / ".nproc" / "config.json"
    config_path.parent.mkdir(exist_ok=True)
    atomic_write_json(config_path, cfg.model_dump(mode="json"))
    threads = None  # the workers inherit this process's environment
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        threads = os.environ["OMP_NUM_THREADS"] = str(max(1, usable_devices()[0] // nproc))
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
    )
    argv = [
        "-m",
        "composer_replication.cli.main",
        "train",
        str(config_path),
        "--out",
        str(out),
        *worker_flags,
    ]
    try:
        elastic_launch(launch, entrypoint=sys.executable)(*argv)
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        first = next((c for c in codes if c > 0), codes[0] if codes else 1)
        print(f"composer-replication train: a worker failed (exit codes {codes}); --resume continues "
              "from the last checkpoint", file=sys.stderr)  # fmt: skip
        return first if first > 0 else 128 - first
    finally:
        if threads is not None:
            del os.environ["OMP_NUM_THREADS"]
    return 0
