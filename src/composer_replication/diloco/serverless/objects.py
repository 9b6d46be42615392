"""Reading and writing the all-reduce's objects: safetensors files with their digest in the metadata.

Every object is hashed once, while it streams in (:func:`read_object`) or straight from the tensors'
memory (:func:`put_tensors`); tensors are decoded as views on the downloaded buffer, never copied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from composer_replication.diloco.serverless import digest, tensorfile
from composer_replication.diloco.serverless.store import ObjectStore

__all__ = ["fetch_upload", "get_tensors", "put_tensors", "read_object", "validate_upload"]

_READ_CHUNK = 4 << 20  # bytes per read: hashed while still in cache


def read_object(store: ObjectStore, key: str) -> tuple[Any, dict[str, str], str]:
    """``(content, metadata, "<algorithm>:<hex>")`` of ``key``, hashed while it streams into one buffer.

    The content is a writable buffer (an uninitialised numpy array: no pass to zero it first).
    """
    opener = getattr(store, "open_read", None)
    if opener is None:  # a store with only the basic protocol
        data, meta = store.get(key)
        algorithm = digest.expected(meta)[0]
        return bytearray(data), meta, f"{algorithm}:{digest.new(algorithm, data).hexdigest()}"
    stream, size, meta = opener(key)
    algorithm = digest.expected(meta)[0]
    buf, h, pos = np.empty(size, dtype=np.uint8), digest.new(algorithm), 0
    view = buf.data
    with stream:
        while pos < size:
            n = stream.readinto(view[pos : min(pos + _READ_CHUNK, size)])
            if not n:  # the transfer, not the upload, is at fault: fail like any broken download
                raise OSError(f"{key}: the read ended after {pos} of {size} bytes on {store.describe()}")
            h.update(view[pos : pos + n])
            pos += n
        stream.readinto(bytearray(1))  # at the end: lets the client check and reuse the connection
    return buf, meta, f"{algorithm}:{h.hexdigest()}"


def validate_upload(
    data: Any,
    meta: Mapping[str, str],
    sha: str,
    like: Mapping[str, torch.Tensor],
    expect_sha: str | None = None,
) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Check one upload; ``(tensors, "")`` if good (views on ``data``), ``(None, reason)`` if not."""
    algorithm, declared = digest.expected(meta)
    if f"{algorithm}:{declared}" != sha:
        return (
            None,
            f"{algorithm} mismatch (metadata {meta.get(algorithm)!r}, content {sha.partition(':')[2]})",
        )
    if expect_sha is not None and sha != expect_sha:
        return None, f"content digest {sha} differs from the manifest's {expect_sha}"
    try:
        tensors = tensorfile.decode(data)
    except ValueError as exc:  # a malformed file is a rejected upload, not a crash
        return None, f"not a safetensors file: {exc}"
    if sorted(tensors) != sorted(like):
        return None, f"tensor names differ: {sorted(set(tensors) ^ set(like))[:5]}"
    for name, t in tensors.items():
        ref = like[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            return None, f"{name}: {tuple(t.shape)}/{t.dtype}, expected {tuple(ref.shape)}/{ref.dtype}"
        if not tensorfile.finite(t):
            return None, f"{name}: non-finite values"
    return tensors, ""


def fetch_upload(
    store: ObjectStore, key: str, like: Mapping[str, torch.Tensor], expect_sha: str | None = None
) -> tuple[dict[str, torch.Tensor] | None, str, dict[str, str]]:
    data, meta, sha = read_object(store, key)
    parsed, why = validate_upload(data, meta, sha, like, expect_sha)
    return parsed, why, {**meta, "digest": sha}


def put_tensors(
    store: ObjectStore,
    key: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> tuple[bool, str]:
    """Create ``key`` as the safetensors file of ``tensors`` (no copy on a streaming store), its digest
    in the metadata: ``(created, "<algorithm>:<hex>")``."""
    parts = tensorfile.encode(tensors)
    h = digest.new(digest.WRITE)
    for part in parts:
        h.update(part)
    meta = {**(metadata or {}), digest.WRITE: h.hexdigest()}
    put_parts = getattr(store, "put_parts_if_absent", None)
    if put_parts is not None:
        created = put_parts(key, parts, metadata=meta)
    else:
        created = store.put_if_absent(key, b"".join(parts), metadata=meta)
    return created, f"{digest.WRITE}:{meta[digest.WRITE]}"


def get_tensors(store: ObjectStore, key: str) -> dict[str, torch.Tensor]:
    """The tensors of ``key`` (written by :func:`put_tensors`); ``ValueError`` if its digest or
    structure is wrong, ``KeyError`` if it does not exist."""
    data, meta, found = read_object(store, key)
    algorithm, declared = digest.expected(meta)
    if found != f"{algorithm}:{declared}":
        raise ValueError(
            f"{key} on {store.describe()}: {algorithm} mismatch (metadata {declared!r}, content {found})"
        )
    try:
        return tensorfile.decode(data)
    except ValueError as exc:
        raise ValueError(f"{key} on {store.describe()}: not a safetensors file: {exc}") from None
