"""The executor protocol (API reference §12) and the helpers every backend shares.

An executor starts N replicas of an entrypoint somewhere (local processes, Modal, HF Jobs,
SageMaker, Kubernetes), reports their state, shows their logs, cancels them one at a time, collects
their results, and ``describe``\\ s what it would launch (``composer-replication launch --dry-run``).
Every backend lives in its own module and imports its SDK lazily; :mod:`.factory` picks one by name.

Entrypoints are named ``"package.module:function"``; the function is called as
``function(entrypoint_args, rank=R, world_size=N)`` and returns a JSON-able result. The default is
:func:`composer_replication.diloco.replica.run_replica`.
"""

from __future__ import annotations

import json
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ReplicaHandle",
    "ReplicaResult",
    "ServerlessExecutor",
    "ReplicaFailedError",
    "Launch",
    "ExecutorBase",
    "DEFAULT_ENTRYPOINT",
    "REPLICA_MODULE",
    "STATES",
    "TERMINAL_STATES",
    "entrypoint_name",
    "resolve_entrypoint",
    "replica_command",
    "last_json",
    "wait_for_states",
    "results_from_logs",
    "finish",
    "state_map",
]

DEFAULT_ENTRYPOINT = "composer_replication.diloco.replica:run_replica"
REPLICA_MODULE = "composer_replication.diloco.serverless.replica_entrypoint"

# Normalised replica states; each backend maps its own vocabulary onto these (`state_map`).
STATES = ("pending", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


def state_map(**names: str | tuple[str, ...]) -> dict[str, str]:
    """A provider's state names -> the normalised replica states, written per normalised state (a keyword,
    one of `STATES`) with the provider's name or names for it, e.g. ``state_map(running="RUNNING",
    cancelled=("CANCELED", "DELETED"))``. Backends read a name the map lacks as ``unknown``."""
    wrong = sorted(set(names) - set(STATES))
    if wrong:
        raise ValueError(f"state_map: {wrong} are not replica states; use {', '.join(STATES)}")
    return {n: state for state, ns in names.items() for n in ((ns,) if isinstance(ns, str) else ns)}


@dataclass
class ReplicaHandle:
    """Opaque handle returned by ``ServerlessExecutor.launch_replicas``; ``metadata`` is backend-specific."""

    rank: int
    backend_name: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class ReplicaResult:
    """What ``collect`` returns per replica: its final state, its entrypoint's result, or the error."""

    rank: int
    state: str
    value: Any = None
    error: str | None = None


class ReplicaFailedError(RuntimeError):
    """Raised by ``collect(..., raise_on_failure=True)`` when a replica failed or was cancelled.

    ``results`` holds every replica's :class:`ReplicaResult` (rank order), ``failed`` those that did
    not succeed; the message names each failed rank, its state and the last line of its error.
    """

    def __init__(self, results: Sequence[ReplicaResult]) -> None:
        self.results = list(results)
        self.failed = [r for r in self.results if r.state != "succeeded"]
        parts = []
        for r in self.failed:
            last = (r.error or "").strip().splitlines()[-1:] or ["no error output"]
            parts.append(f"replica {r.rank} {r.state}: {last[0][:300]}")
        super().__init__(
            f"{len(self.failed)}/{len(self.results)} replicas did not succeed; " + "; ".join(parts)
        )


@runtime_checkable
class ServerlessExecutor(Protocol):
    backend_name: str
    supports_inter_replica_network: bool

    def launch_replicas(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[ReplicaHandle]: ...

    def poll(self, handle: ReplicaHandle) -> str:
        """One of ``pending``, ``running``, ``succeeded``, ``failed``, ``cancelled``, ``unknown``."""
        ...

    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str: ...

    def cancel(self, handle: ReplicaHandle) -> None:
        """Stop this replica only; the others keep running."""
        ...

    def collect(
        self, handles: list[ReplicaHandle], *, timeout: int | None = None, raise_on_failure: bool = False
    ) -> list[ReplicaResult]:
        """Wait for every replica to end (``TimeoutError`` after ``timeout`` s); results in rank order.

        With ``raise_on_failure``, a replica that failed or was cancelled raises
        :class:`ReplicaFailedError` (carrying every result) once all have ended.
        """
        ...

    def describe(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> str:
        """What ``launch_replicas`` with these arguments would start, as text; starts nothing."""
        ...


def entrypoint_name(entrypoint: str | Callable[..., Any]) -> str:
    """``"module:function"`` for a callable or a string; the form every backend ships to its replicas."""
    if callable(entrypoint):
        module, qual = entrypoint.__module__, entrypoint.__qualname__
        if "<" in qual or module == "__main__":
            raise ValueError(
                f"entrypoint {qual!r} must be a module-level function importable by the replicas "
                "(not a lambda, a closure or a function in __main__)"
            )
        return f"{module}:{qual}"
    if ":" not in entrypoint:
        raise ValueError(f"entrypoint {entrypoint!r} must look like 'package.module:function'")
    return entrypoint


def resolve_entrypoint(name: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` name refers to."""
    import importlib

    module, _, func = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in func.split("."):
        obj = getattr(obj, part)
    return obj


def replica_command(
    entrypoint: str,
    config: Mapping[str, Any],
    n_replicas: int,
    *,
    rank: int | None = None,
    setup: str | None = None,
    python: str = "python",
) -> list[str]:
    """The command line of one replica (the config inline); without ``rank`` it comes from the environment."""
    run = [
        python, "-m", REPLICA_MODULE, "--entrypoint", entrypoint,
        "--config-json", json.dumps(dict(config), sort_keys=True),
        *(["--rank", str(rank)] if rank is not None else []), "--world-size", str(n_replicas),
    ]  # fmt: skip
    if not setup:
        return run
    return ["bash", "-lc", f"{setup} && {shlex.join(run)}"]


def last_json(logs: str) -> Any:
    """The last JSON object line of a log (a replica's ``done`` record), or None."""
    for line in reversed(logs.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def wait_for_states(
    poll_all: Callable[[], dict[int, str]],
    *,
    timeout: float | None,
    interval: float,
    what: str,
    terminal: frozenset[str] = TERMINAL_STATES,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[int, str]:
    """Call ``poll_all`` until every state is terminal; ``TimeoutError`` naming ``what`` after ``timeout`` s."""
    end = None if timeout is None else clock() + timeout
    while True:
        states = poll_all()
        if all(s in terminal for s in states.values()):
            return states
        if end is not None and clock() > end:
            raise TimeoutError(f"{what} still running after {timeout}s: {states}")
        sleep(interval)


def finish(results: list[ReplicaResult], *, raise_on_failure: bool) -> list[ReplicaResult]:
    """``results`` in rank order; raises :class:`ReplicaFailedError` if asked to and one did not succeed."""
    results = sorted(results, key=lambda r: r.rank)
    if raise_on_failure and any(r.state != "succeeded" for r in results):
        raise ReplicaFailedError(results)
    return results


def results_from_logs(
    handles: Sequence[ReplicaHandle],
    states: Mapping[int, str],
    stream_logs: Callable[..., str],
    *,
    reasons: Mapping[int, str] | None = None,
) -> list[ReplicaResult]:
    """Each replica's result read from its last 50 log lines: the value is its last JSON line (the
    ``done`` record); a replica that did not succeed gets its ``reasons`` entry and the log's tail."""
    out = []
    for h in handles:
        logs, state = stream_logs(h, n_lines=50), states[h.rank]
        why = (reasons or {}).get(h.rank)
        error = None if state == "succeeded" else "\n".join(filter(None, [why, logs[-2000:]]))
        out.append(ReplicaResult(rank=h.rank, state=state, value=last_json(logs), error=error))
    return out


@dataclass(frozen=True)
class Launch:
    """The arguments of one ``launch_replicas``/``describe`` call, the entrypoint as ``module:function``."""

    n_replicas: int
    entrypoint: str
    entrypoint_args: Mapping[str, Any]
    gpu: str | None = None
    timeout: int = 3600

    def __post_init__(self) -> None:
        entrypoint_name(self.entrypoint)  # a ValueError unless it looks like 'package.module:function'

    def command(self, *, rank: int | None = None, setup: str | None = None) -> list[str]:
        """:func:`replica_command` of this launch (without ``rank`` the replica reads it from the environment)."""
        return replica_command(self.entrypoint, self.entrypoint_args, self.n_replicas, rank=rank, setup=setup)


class ExecutorBase(ABC):
    """The protocol's ``describe`` and ``launch_replicas``, written once for every backend.

    Both turn their arguments into one :class:`Launch`; a backend implements ``_describe(launch)``
    (the text ``--dry-run`` prints) and ``_launch(launch)`` (start the replicas, return their handles),
    ``poll`` and ``stream_logs``; a backend whose replicas report through their logs collects with
    :meth:`_collect_from_logs`.
    """

    backend_name: str
    supports_inter_replica_network: bool

    def describe(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> str:
        """What ``launch_replicas`` with these arguments would start, as text; starts nothing."""
        return self._describe(Launch(n_replicas, entrypoint_name(entrypoint), entrypoint_args, gpu, timeout))

    def launch_replicas(
        self,
        n_replicas: int,
        entrypoint: str | Callable[..., Any],
        entrypoint_args: Mapping[str, Any],
        *,
        gpu: str | None = None,
        timeout: int = 3600,
    ) -> list[ReplicaHandle]:
        """Start ``n_replicas`` replicas of ``entrypoint``; one handle each, in rank order."""
        return self._launch(Launch(n_replicas, entrypoint_name(entrypoint), entrypoint_args, gpu, timeout))

    @abstractmethod
    def _describe(self, launch: Launch) -> str: ...

    @abstractmethod
    def _launch(self, launch: Launch) -> list[ReplicaHandle]: ...

    @abstractmethod
    def poll(self, handle: ReplicaHandle) -> str: ...

    @abstractmethod
    def stream_logs(self, handle: ReplicaHandle, *, n_lines: int = 200) -> str: ...

    def _handles(self, metadata: Iterable[dict[str, Any]]) -> list[ReplicaHandle]:
        """One handle per replica, rank = position, from each replica's backend metadata."""
        return [ReplicaHandle(rank, self.backend_name, meta) for rank, meta in enumerate(metadata)]

    def _collect_from_logs(
        self,
        handles: list[ReplicaHandle],
        *,
        timeout: float | None,
        raise_on_failure: bool,
        interval: float,
        what: str,
        poll_all: Callable[[], dict[int, str]] | None = None,
        reasons: Mapping[int, str] | None = None,
    ) -> list[ReplicaResult]:
        """``collect``: poll (``poll_all``, or each handle's ``poll``) until every replica has ended, then
        read each result from its log (:func:`results_from_logs`) and :func:`finish`."""
        states = wait_for_states(
            poll_all or (lambda: {h.rank: self.poll(h) for h in handles}), timeout=timeout, interval=interval,
            what=what,
        )  # fmt: skip
        results = results_from_logs(handles, states, self.stream_logs, reasons=reasons)
        return finish(results, raise_on_failure=raise_on_failure)
