"""Replicas as local OS processes: the executor for one machine, tests, and debugging a cloud config.

Each replica is ``python -m composer_replication.diloco.serverless.replica_entrypoint`` in its own
process group, with stdout/stderr in ``<run_dir>/replica-<rank>.log`` and its result in
``<run_dir>/replica-<rank>.result.json``. Replicas share the loopback network, so both the
object-store exchange and torchft work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from composer_replication.diloco.serverless.executor import (
    REPLICA_MODULE,
    TERMINAL_STATES,
    ExecutorBase,
    Launch,
    ReplicaHandle,
    ReplicaResult,
    entrypoint_name,
    finish,
    wait_for_states,
)

__all__ = ["LocalProcessExecutor"]


def _tail(path: str | os.PathLike[str], n_lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * max(n_lines, 1)))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-n_lines:])


class LocalProcessExecutor(ExecutorBase):
    """Real OS processes on this machine."""

    backend_name = "local_process"
    supports_inter_replica_network = True

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="diloco-local-"))
        self.python = python
        self.env = dict(env or {})
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._cancelled: set[int] = set()

    def command(self, rank: int, n_replicas: int, entrypoint: str, config_path: Path) -> list[str]:
        return [
            self.python, "-m", REPLICA_MODULE,
            "--entrypoint", entrypoint, "--config", str(config_path),
            "--rank", str(rank), "--world-size", str(n_replicas),
            "--result-file", str(self.run_dir / f"replica-{rank}.result.json"),
        ]  # fmt: skip

    def _describe(self, launch: Launch) -> str:
        """The config and the command of every replica, as JSON."""
        n, config_path = launch.n_replicas, self.run_dir / "replica-config.json"
        commands = [self.command(r, n, launch.entrypoint, config_path) for r in range(n)]
        return json.dumps({"config": dict(launch.entrypoint_args), "commands": commands}, indent=2)

    def _launch(self, launch: Launch) -> list[ReplicaHandle]:
        n = launch.n_replicas
        if n < 1:
            raise ValueError(f"n_replicas={n} must be >= 1")
        if launch.gpu:
            raise ValueError(
                "the local backend runs on this machine's CPU; drop --gpu or pick a cloud backend"
            )
        args = launch.entrypoint_args
        return [self.launch_one(r, n, launch.entrypoint, args, timeout=launch.timeout) for r in range(n)]

    def launch_one(
        self,
        rank: int,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        timeout: int = 3600,
    ) -> ReplicaHandle:
        """Start (or restart) one replica; a restarted replica's log is appended to."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / "replica-config.json"
        from composer_replication._io import atomic_write_json

        atomic_write_json(config_path, dict(entrypoint_args))
        log_path = self.run_dir / f"replica-{rank}.log"
        result_path = self.run_dir / f"replica-{rank}.result.json"
        result_path.unlink(missing_ok=True)
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command(rank, n_replicas, entrypoint_name(entrypoint), config_path),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: cancel reaches any children too
            )
        self._procs[rank] = proc
        self._cancelled.discard(rank)
        return ReplicaHandle(
            rank=rank,
            backend_name=self.backend_name,
            metadata={
                "pid": proc.pid,
                "log": str(log_path),
                "result": str(result_path),
                "deadline": time.time() + timeout,
            },
        )

    def _proc(self, handle: ReplicaHandle) -> subprocess.Popen[bytes] | None:
        proc = self._procs.get(handle.rank)
        return proc if proc is not None and proc.pid == handle.metadata.get("pid") else None

    def poll(self, handle: ReplicaHandle) -> str:
        proc = self._proc(handle)
        if proc is None:
            return "unknown"
        rc = proc.poll()
        if rc is None:
            if time.time() > handle.metadata["deadline"]:
                self.cancel(handle)
                return "failed"
            return "running"
        if handle.rank in self._cancelled:
            return "cancelled"
        return "succeeded" if rc == 0 else "failed"

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        return _tail(handle.metadata["log"], n_lines)

    def kill(self, handle: ReplicaHandle, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the replica's process group (tests use it to simulate a crash)."""
        proc = self._proc(handle)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)
            proc.wait()

    def cancel(self, handle: ReplicaHandle) -> None:
        proc = self._proc(handle)
        if proc is None or proc.poll() is not None:
            return
        self._cancelled.add(handle.rank)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        states = wait_for_states(
            lambda: {h.rank: self.poll(h) for h in handles},
            timeout=timeout,
            interval=0.1,
            what=f"replicas (logs in {self.run_dir})",
            terminal=TERMINAL_STATES | {"unknown"},  # a process this executor did not start
        )
        out = []
        for h in handles:
            try:
                value = json.loads(Path(h.metadata["result"]).read_text())
            except FileNotFoundError:
                value = None
            state = states[h.rank]
            error = None if state == "succeeded" else self.stream_logs(h, n_lines=20)
            out.append(ReplicaResult(rank=h.rank, state=state, value=value, error=error))
        return finish(out, raise_on_failure=raise_on_failure)
