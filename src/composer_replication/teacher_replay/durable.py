"""Group-committed fsync for append-only files written from an event loop.

``os.fsync`` blocks for milliseconds; called once per record on the event loop it serialises every
call behind the disk. Here the fsync runs in a worker thread, and callers that wrote while one was
in progress share the next one, so N concurrent writers cost about two fsyncs, not N.
"""

from __future__ import annotations

import asyncio
import os


class GroupFsync:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        # fsync on any descriptor of the file flushes the file's data; a read-only one is enough.
        self._fd = os.open(path, os.O_RDONLY)
        self._written = 0
        self._synced = 0
        self._inflight: asyncio.Future | None = None

    def wrote(self) -> None:
        """Call after each (flushed) write."""
        self._written += 1

    async def _fsync(self, upto: int) -> None:
        await asyncio.to_thread(os.fsync, self._fd)
        self._synced = max(self._synced, upto)

    async def sync(self) -> None:
        """Return once everything written before this call is on disk."""
        target = self._written
        while self._synced < target:
            if self._inflight is None or self._inflight.done():
                self._inflight = asyncio.ensure_future(self._fsync(self._written))
            await asyncio.shield(self._inflight)

    def close(self) -> None:
        os.close(self._fd)
