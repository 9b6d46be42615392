"""One process at a time per output directory: an exclusive ``flock`` on ``DIR/.lock`` naming its holder.

The lock is held for as long as the process runs the command and is released by the kernel when the
process exits, however it exits (SIGKILL included), so a crash never leaves a stale lock behind. The
file holds the holder's pid, host and command line, for the error the next process shows.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = ".lock"


class DirectoryInUse(PermissionError):
    """Another process holds the directory's lock. The message names its pid."""


def _describe(fd: int) -> str:
    text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
    return text or "a process that has not written its pid yet"


def lock_holder(directory: str | os.PathLike[str]) -> str | None:
    """Who holds ``directory``'s lock (``pid N on HOST (since T): command``), or None if nobody does."""
    path = Path(directory) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(fd)
    finally:
        os.close(fd)
    return None


def _try_lock(fd: int, attempts: int = 5) -> bool:
    # A few tries over ~0.1 s: `lock_holder` (status) takes a shared lock for microseconds.
    for i in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if i + 1 < attempts:
                time.sleep(0.025)
    return False


@contextmanager
def directory_lock(
    directory: str | os.PathLike[str], what: str = "directory", how_to_stop: str = ""
) -> Iterator[None]:
    """Hold ``directory``'s lock for the ``with`` body; ``DirectoryInUse`` at once if another process has it."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise NotADirectoryError(f"{d}: is a file; the {what} must be a directory (pass another path)")
    d.mkdir(parents=True, exist_ok=True)
    fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            raise DirectoryInUse(
                f"{d}: this {what} is in use by {_describe(fd)}; wait for it to finish, stop it"
                f"{f' ({how_to_stop})' if how_to_stop else ''}, or use another directory"
            ) from None
        cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]
        os.ftruncate(fd, 0)
        host = socket.gethostname() or "?"
        os.pwrite(fd, f"pid {os.getpid()} on {host} (since {time.strftime('%H:%M:%S')}): {cmd}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock
