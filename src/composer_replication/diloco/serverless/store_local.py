"""An object store in a local directory (one machine, or a POSIX shared file system).

Each object is a file ``u32 header length | JSON metadata | bytes``. A create-only write stages the
whole object in a temporary file (fsynced) and publishes it with ``os.link``, which fails if the name
exists: readers never see a partial object and exactly one of several racing writers wins. Published
files are never modified in place.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["LocalDirStore"]

_LEN = struct.Struct("<I")


class LocalDirStore:
    """Objects as files under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"object key {key!r} must be relative and must not contain '..'")
        return self.root / key

    def _stage(self, path: Path, parts: Sequence[Any], metadata: Mapping[str, str] | None) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = json.dumps(dict(metadata or {}), sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb", buffering=0) as f:  # unbuffered: each part goes to the kernel as is
            f.write(_LEN.pack(len(header)) + header)
            for part in parts:
                view = memoryview(part).cast("B")
                while view:  # a raw write may be short
                    view = view[f.write(view) :]
            os.fsync(f.fileno())
        return tmp

    def put_parts_if_absent(
        self, key: str, parts: Sequence[Any], *, metadata: Mapping[str, str] | None = None
    ) -> bool:
        path = self._path(key)
        tmp = self._stage(path, parts, metadata)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put_if_absent(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> bool:
        return self.put_parts_if_absent(key, [data], metadata=metadata)

    def put(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        path = self._path(key)
        os.replace(self._stage(path, [data], metadata), path)

    def open_read(self, key: str) -> tuple[BinaryIO, int, dict[str, str]]:
        try:
            f = open(self._path(key), "rb", buffering=0)  # noqa: SIM115 - the caller closes it
        except FileNotFoundError:
            raise KeyError(key) from None
        try:
            (n,) = _LEN.unpack(f.read(_LEN.size))
            meta = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size - _LEN.size - n
        except BaseException:
            f.close()
            raise
        return f, size, meta

    def get(self, key: str) -> tuple[bytes, dict[str, str]]:
        f, size, meta = self.open_read(key)
        with f:
            data = f.read()  # one read to EOF: straight into one bytes object of the right size
        return data, meta

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if base.is_file():  # the prefix is a whole key
            return [] if base.name.startswith(".") else [prefix.rstrip("/")]
        if not base.exists():
            return []
        root = self.root
        return sorted(
            str(p.relative_to(root)).replace(os.sep, "/")
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def describe(self) -> str:
        return f"local directory {self.root}"
