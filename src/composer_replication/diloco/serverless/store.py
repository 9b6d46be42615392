"""Object stores for the pseudo-gradient exchange: S3 (any S3-compatible server) and a local directory.

Both give the one primitive the leaderless protocol needs — a **create-only** write: the first writer
of a key wins and every later writer is told the key exists (S3 ``PutObject`` with
``If-None-Match: *`` → 412; locally ``link(2)``, which fails with ``EEXIST`` like ``O_EXCL``).
Objects carry string metadata; a ``sha256`` entry is written by the caller and checked on read.

Selected by ``type`` in a config mapping (:func:`make_store`): ``{"type": "local", "root": ...}`` or
``{"type": "s3", "bucket": ..., "prefix": ..., "endpoint_url": ..., "region": ...}``.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["ObjectStore", "LocalDirStore", "S3Store", "make_store"]


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


class LocalDirStore:
    """Objects as files under ``root``; each file is ``u32 header length | JSON metadata | bytes``.

    A create-only write stages the whole object in a temporary file and publishes it with
    ``os.link``, which fails if the name exists: readers never see a partial object and exactly one
    of several racing writers wins, on one machine or on a shared POSIX file system.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"object key {key!r} must be relative and must not contain '..'")
        return self.root / key

    def _stage(self, path: Path, data: bytes, metadata: Mapping[str, str] | None) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        header = json.dumps(dict(metadata or {}), sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<I", len(header)))
            f.write(header)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put_if_absent(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> bool:
        path = self._path(key)
        tmp = self._stage(path, data, metadata)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def put(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        path = self._path(key)
        os.replace(self._stage(path, data, metadata), path)

    def get(self, key: str) -> tuple[bytes, dict[str, str]]:
        try:
            blob = self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None
        (n,) = struct.unpack_from("<I", blob)
        return blob[4 + n :], json.loads(blob[4 : 4 + n])

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
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


class S3Store:
    """A bucket (and key prefix) on S3 or any S3-compatible server (moto, SeaweedFS, R2, MinIO, GCS).

    ``client`` may be any boto3 S3 client; otherwise one is built from ``endpoint_url``/``region``
    and the usual AWS credential chain (keys are never logged or stored here).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        client: Any = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        create_bucket: bool = False,
    ) -> None:
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as exc:
                raise ImportError("S3Store needs boto3: pip install 'composer-replication[s3]'") from exc
            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=region or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                config=Config(retries={"max_attempts": 5, "mode": "standard"}),
            )
        self.client, self.bucket, self.prefix = client, bucket, prefix.strip("/")
        if create_bucket:
            try:
                client.create_bucket(Bucket=bucket)
            except client.exceptions.BucketAlreadyOwnedByYou:
                pass

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    @staticmethod
    def _code(exc: Exception) -> str:
        err = getattr(exc, "response", {}).get("Error", {})
        return str(err.get("Code", ""))

    def put_if_absent(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> bool:
        from botocore.exceptions import ClientError

        for attempt in range(8):
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    Body=data,
                    Metadata=dict(metadata or {}),
                    IfNoneMatch="*",
                )
                return True
            except ClientError as exc:
                code = self._code(exc)
                if code in ("PreconditionFailed", "412"):
                    return False
                # 409: another create-only write on this key is in flight; once it lands we get 412.
                if code in ("ConditionalRequestConflict", "409") and attempt < 7:
                    time.sleep(0.05 * 2**attempt)
                    continue
                raise
        return False  # pragma: no cover - the loop returns or raises

    def put(self, key: str, data: bytes, *, metadata: Mapping[str, str] | None = None) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=data, Metadata=dict(metadata or {})
        )

    def get(self, key: str) -> tuple[bytes, dict[str, str]]:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            raise
        return resp["Body"].read(), dict(resp.get("Metadata", {}))

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def make_store(cfg: Mapping[str, Any] | ObjectStore) -> ObjectStore:
    """Build a store from ``{"type": "local"|"s3", ...}`` (or pass a store through)."""
    if isinstance(cfg, ObjectStore):
        return cfg
    kind = cfg.get("type")
    args = {k: v for k, v in cfg.items() if k != "type"}
    if kind == "local":
        return LocalDirStore(**args)
    if kind == "s3":
        return S3Store(**args)
    raise ValueError(f"store type {kind!r} is not one of 'local', 's3' (set store.type in the config)")
