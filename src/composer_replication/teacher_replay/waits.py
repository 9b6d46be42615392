"""Every wait of a replay run ends within about a second of a stop.

A replay run waits in three places: a request in flight, the sleep before a retry, and a teacher's
cool-down after a ``Retry-After``. `StopWatch` runs each of them through `StopWatch.wait` (requests)
or `StopWatch.sleep`. Once the run's `Stop` gives a reason (a STOP file, a signal the kill switch
caught, a spend cap), every sleep in progress ends at once, every request still in flight
``FINISH_S`` later is abandoned (an answer about to arrive is paid for: it gets that long to land),
each raising `Stopped`; a wait that starts afterwards raises it at once.

The stop is consulted before each send (`StopWatch.poll`, as replay always did) and, while some wait
has lasted ``GRACE_S`` or longer, every ``POLL_S`` by a watcher task. So a stop ends a sleep within
``GRACE_S + POLL_S`` (0.6 s) and a request within ``GRACE_S + POLL_S + FINISH_S`` (1.1 s), and a run
whose waits are short (a fast server) consults its stop exactly as often as before: once per send.

Not covered: work outside the event loop. A worker thread (the in-process transformers teacher) is
told to stop through its backend (cancelling ``complete`` sets its cancel flag) and ends at its next
step; a blocking call that never returns to the loop is not interrupted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from composer_replication.safety.stop import Stop

T = TypeVar("T")

POLL_S = 0.2  # how often the watcher looks while some wait is long
GRACE_S = 0.4  # a wait shorter than this never makes the watcher consult the stop
FINISH_S = 0.5  # after a stop, how long a request in flight may still finish before it is abandoned


class Stopped(Exception):
    """A wait ended by the run's stop; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StopWatch:
    """The run's stop, polled before each send and watched during long waits (module docstring).

    ``stop`` is the run's `safety.Stop`; ``spend`` returns the spend so far, fed to ``stop.observe``.
    The first reason latches in ``reason``.
    """

    def __init__(self, stop: Stop, spend: Callable[[], float]) -> None:
        self._stop = stop
        self._spend = spend
        self.reason: str | None = None
        self._waits: dict[asyncio.Task[Any], tuple[float, bool]] = {}  # task -> (began, is a request)
        self._interrupted: set[asyncio.Task[Any]] = set()
        self._watcher: asyncio.Task[None] | None = None

    def poll(self) -> str | None:
        """Feed the spend so far and ask for a reason; a new reason interrupts every wait in progress."""
        if self.reason is None:
            self.reason = self._stop.observe(spend_usd=self._spend())
            if self.reason is not None:
                self._interrupt(requests=False)  # the watcher abandons the requests FINISH_S later
        return self.reason

    async def wait(self, aw: Awaitable[T], *, request: bool = True) -> T:
        """``await aw``, or raise `Stopped` once the run is stopped (before it starts, or while it runs)."""
        if self.reason is not None:
            if asyncio.iscoroutine(aw):
                aw.close()  # never started: no "coroutine was never awaited" warning
            raise Stopped(self.reason)
        task = asyncio.current_task()
        assert task is not None
        self._waits[task] = (time.monotonic(), request)
        try:
            return await aw
        except asyncio.CancelledError:
            # ours alone (not also the event loop's shutdown or a caller's cancel): a stop, not a cancel
            if task in self._interrupted and task.uncancel() == 0 and self.reason is not None:
                raise Stopped(self.reason) from None
            raise
        finally:
            self._waits.pop(task, None)
            self._interrupted.discard(task)

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await self.wait(asyncio.sleep(seconds), request=False)

    def start(self) -> None:
        """Start the watcher task (call inside the run's event loop)."""
        self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="replay-stop-watch")

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            try:
                await self._watcher
            except asyncio.CancelledError:
                pass
            self._watcher = None

    async def _watch(self) -> None:
        while self.reason is None:
            await asyncio.sleep(POLL_S)
            now = time.monotonic()
            if any(now - began >= GRACE_S for began, _ in self._waits.values()):
                self.poll()
        await asyncio.sleep(FINISH_S)
        self._interrupt(requests=True)

    def _interrupt(self, *, requests: bool) -> None:
        for task, (_, is_request) in list(self._waits.items()):
            if (requests or not is_request) and task not in self._interrupted:
                self._interrupted.add(task)
                task.cancel()
