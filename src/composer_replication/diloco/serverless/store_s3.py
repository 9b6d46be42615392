"""An object store on S3 or any S3-compatible server (AWS S3, moto, SeaweedFS, R2, MinIO, GCS).

Create-only writes are ``PutObject`` with ``If-None-Match: *``: 412 means the key exists; 409 means
another create-only write on the key is in flight, retried with backoff until it lands and becomes a
412. Credentials come from the usual AWS chain (environment, profile, instance role); they are never
logged or stored here.
"""

from __future__ import annotations

import bisect
import io
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from composer_replication._extras import require

__all__ = ["S3Store"]


class _Concat(io.RawIOBase):
    """A seekable read-only stream over the concatenation of buffers (botocore sizes, hashes and sends it)."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.views = [memoryview(p).cast("B") for p in parts]
        self.starts = list(itertools.accumulate((v.nbytes for v in self.views), initial=0))
        self.size, self.pos = self.starts[-1], 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = offset + (0, self.pos, self.size)[whence]
        return self.pos

    def readinto(self, buffer: Any) -> int:
        out, n = memoryview(buffer).cast("B"), 0
        while n < len(out) and self.pos < self.size:
            i = bisect.bisect_right(self.starts, self.pos) - 1
            view, offset = self.views[i], self.pos - self.starts[i]
            k = min(len(out) - n, view.nbytes - offset)
            out[n : n + k] = view[offset : offset + k]
            n, self.pos = n + k, self.pos + k
        return n


class S3Store:
    """A bucket (and key prefix) on S3 or any S3-compatible server.

    ``client`` may be any boto3 S3 client; otherwise one is built from ``endpoint_url``/``region``
    and the usual AWS credential chain.
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
            require("s3", purpose="S3Store")
            import boto3
            from botocore.config import Config

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

    def put_if_absent(self, key: str, data: Any, *, metadata: Mapping[str, str] | None = None) -> bool:
        from botocore.exceptions import ClientError

        for attempt in range(8):
            if isinstance(data, _Concat):
                data.seek(0)  # a retry sends the whole body again
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

    def put_parts_if_absent(
        self, key: str, parts: Sequence[Any], *, metadata: Mapping[str, str] | None = None
    ) -> bool:
        # the body reads straight from the parts: no object-sized buffer is built to join them
        return self.put_if_absent(key, _Concat(parts), metadata=metadata)

    def put(self, key: str, data: Any, *, metadata: Mapping[str, str] | None = None) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=data, Metadata=dict(metadata or {})
        )

    def open_read(self, key: str) -> tuple[Any, int, dict[str, str]]:
        from botocore.exceptions import ClientError

        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if self._code(exc) in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            raise
        return resp["Body"], int(resp["ContentLength"]), dict(resp.get("Metadata", {}))

    def get(self, key: str) -> tuple[bytes, dict[str, str]]:
        body, _, meta = self.open_read(key)
        with body:
            return body.read(), meta

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"
