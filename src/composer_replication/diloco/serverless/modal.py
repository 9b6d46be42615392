"""Modal executor: one ``Function.spawn`` per replica (extra ``modal``).

What is covered: building the Modal function that runs a replica (image with this package installed,
GPU, timeout, secrets by name), spawning N calls in a detached app, polling them
(``FunctionCall.get(timeout=0)``), cancelling, collecting results. ``build_function().local(...)``
runs a replica in this process, which is how the tests exercise it without Modal's servers.

What is not covered: containers cannot reach each other by default (``i6pn`` /
``modal.experimental.clustered`` are opt-ins this module does not use), so replicas sync through the
object store; spend is bounded only by ``timeout`` per call and the number of replicas. Logs of a
running call come from the replica's status object in the store (Modal's SDK has no per-call log
tail); ``modal app logs`` shows the raw stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from composer_replication._extras import require
from composer_replication.diloco.serverless.executor import (
    ExecutorBase,
    Launch,
    ReplicaHandle,
    ReplicaResult,
    finish,
    resolve_entrypoint,
)

__all__ = ["ModalExecutor", "modal_replica"]


def _modal() -> Any:
    require("modal", purpose="the modal backend")
    import modal

    return modal


def modal_replica(entrypoint: str, config: dict[str, Any], rank: int, world_size: int) -> Any:
    """The body every Modal container runs: resolve the entrypoint and call it."""
    return resolve_entrypoint(entrypoint)(config, rank=rank, world_size=world_size)


class ModalExecutor(ExecutorBase):
    """Replicas as calls of one Modal function in a detached app."""

    backend_name = "modal"
    supports_inter_replica_network = False

    def __init__(
        self,
        *,
        app_name: str = "composer-replication-diloco",
        image: Any = None,
        pip_packages: Sequence[str] = ("composer-replication[torchft,s3]",),
        secrets: Sequence[str] = (),
        cpu: float | None = None,
        memory: int | None = None,
    ) -> None:
        self.app_name, self.image, self.pip_packages = app_name, image, tuple(pip_packages)
        self.secrets, self.cpu, self.memory = tuple(secrets), cpu, memory
        self._app_ctx: Any = None
        self._results: dict[str, Any] = {}

    def function_options(self, *, gpu: str | None = None, timeout: int = 3600) -> dict[str, Any]:
        """What ``app.function`` gets (printed by ``--dry-run``; secrets by name only)."""
        return {
            "gpu": gpu,
            "timeout": timeout,
            "cpu": self.cpu,
            "memory": self.memory,
            "secrets": list(self.secrets),
            "image": "custom" if self.image is not None else f"debian_slim + pip {list(self.pip_packages)}",
            "retries": 0,  # a retried replica would rejoin from the store anyway; keep billing explicit
        }

    def _describe(self, launch: Launch) -> str:
        """The app, the function's options and the ``spawn`` calls, as JSON (secrets by name)."""
        n = launch.n_replicas
        return json.dumps(
            {
                "app": self.app_name,
                "function": self.function_options(gpu=launch.gpu, timeout=launch.timeout),
                "spawn": [[launch.entrypoint, "<config>", r, n] for r in range(n)],
                "config": dict(launch.entrypoint_args),
            },
            indent=2,
        )

    def build_function(self, *, gpu: str | None = None, timeout: int = 3600) -> Any:
        modal = _modal()
        app = modal.App(self.app_name)
        image = self.image
        if image is None:
            image = modal.Image.debian_slim(python_version="3.11").pip_install(*self.pip_packages)
        self.app = app
        return app.function(
            image=image,
            gpu=gpu,
            timeout=timeout,
            cpu=self.cpu,
            memory=self.memory,
            secrets=[modal.Secret.from_name(s) for s in self.secrets],
            retries=0,
            serialized=True,
        )(modal_replica)

    def _launch(self, launch: Launch) -> list[ReplicaHandle]:
        fn = self.build_function(gpu=launch.gpu, timeout=launch.timeout)
        # detach: the spawned calls outlive this client (the launcher may exit or lose its connection)
        self._app_ctx = self.app.run(detach=True)
        self._app_ctx.__enter__()
        config = json.loads(json.dumps(dict(launch.entrypoint_args)))
        calls = [fn.spawn(launch.entrypoint, config, r, launch.n_replicas) for r in range(launch.n_replicas)]
        return self._handles({"call_id": call.object_id} for call in calls)

    def _call(self, handle: ReplicaHandle) -> Any:
        return _modal().FunctionCall.from_id(handle.metadata["call_id"])

    def _outcome(self, handle: ReplicaHandle, timeout: float | None) -> tuple[str, Any, str | None]:
        """(state, value, error) of an ended call, waiting at most ``timeout`` s for it (``TimeoutError``
        while it runs); remembered, so each call's result is fetched once."""
        call_id = handle.metadata["call_id"]
        if call_id not in self._results:
            try:
                self._results[call_id] = ("succeeded", self._call(handle).get(timeout=timeout), None)
            except TimeoutError:
                raise
            except Exception as exc:  # the remote raised, or the call was cancelled
                state = "cancelled" if "cancel" in type(exc).__name__.lower() else "failed"
                self._results[call_id] = (state, None, f"{type(exc).__name__}: {exc}")
        return self._results[call_id]

    def poll(self, handle: ReplicaHandle) -> str:
        try:
            return self._outcome(handle, 0)[0]
        except TimeoutError:
            return "running"

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str:
        state = self.poll(handle)
        _, value, error = self._results.get(handle.metadata["call_id"], (state, None, None))
        if error:
            return error
        if value is not None:
            return json.dumps(value)
        return f"(running; `modal app logs {self.app_name}` streams the output)"

    def cancel(self, handle: ReplicaHandle) -> None:
        self._call(handle).cancel(terminate_containers=True)

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        end = None if timeout is None else time.monotonic() + timeout
        out = []
        for h in sorted(handles, key=lambda h: h.rank):
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                state, value, error = self._outcome(h, left)
            except TimeoutError:
                raise TimeoutError(f"Modal replica {h.rank} still running after {timeout}s") from None
            out.append(ReplicaResult(rank=h.rank, state=state, value=value, error=error))
        if self._app_ctx is not None:
            self._app_ctx.__exit__(None, None, None)
            self._app_ctx = None
        return finish(out, raise_on_failure=raise_on_failure)
