"""The object-store protocol for the pseudo-gradient exchange, and where its implementations live.

Every store gives the one primitive the leaderless protocol needs — a **create-only** write: the
first writer of a key wins and every later writer is told the key exists (S3 ``PutObject`` with
``If-None-Match: *`` → 412; locally ``link(2)``, which fails with ``EEXIST`` like ``O_EXCL``).
Objects carry string metadata; a ``sha256`` entry is written by the caller and checked on read.

Implementations, one file each: :class:`~.store_local.LocalDirStore` (a directory) and
:class:`~.store_s3.S3Store` (any S3-compatible server); :func:`~.factory.make_store` builds one from
``{"type": "local"|"s3", ...}``. Both also offer the two optional fast paths of
:class:`StreamingObjectStore`, which the all-reduce uses when a store has them: a create-only write
of several buffers without joining them, and a read straight into the caller's buffer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from composer_replication.diloco.serverless.store_local import LocalDirStore
from composer_replication.diloco.serverless.store_s3 import S3Store

__all__ = ["ObjectStore", "StreamingObjectStore", "LocalDirStore", "S3Store"]


@runtime_checkable
class ObjectStore(Protocol):
    """The few operations the all-reduce, the replicas and the CLI use."""

    def put_if_absent(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> bool:
        """Create ``key``; ``True`` if this call created it, ``False`` if it already existed."""
        ...

    def put(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        """Create or replace ``key`` (logs, status files; never used for protocol objects)."""
        ...

    def get(self, key: str) -> tuple[bytes, dict[str, str]]:
        """The bytes and metadata of ``key``; ``KeyError`` if it does not exist."""
        ...

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix``, sorted."""
        ...

    def describe(self) -> str:
        """Where the objects live, for messages."""
        ...


@runtime_checkable
class StreamingObjectStore(ObjectStore, Protocol):
    """A store that can also write and read large objects without intermediate copies."""

    def put_parts_if_absent(
        self, key: str, parts: Sequence[Any], *, metadata: Mapping[str, str] | None = None
    ) -> bool:
        """``put_if_absent`` of the concatenation of ``parts`` (bytes-like buffers), without joining them."""
        ...

    def open_read(self, key: str) -> tuple[Any, int, dict[str, str]]:
        """``(stream, size, metadata)``: a binary stream with ``readinto`` over the object's ``size`` bytes.

        ``KeyError`` if the key does not exist. The caller reads exactly ``size`` bytes and closes it.
        """
        ...
