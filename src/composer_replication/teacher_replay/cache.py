"""Append-only cache of teacher call results, keyed by (state_id, teacher, prompt hash).

A rerun loads the file and sends only the calls that have no successful row; errors are recorded
(so a run's failures are visible) but retried next time, because a failed call was not billed
beyond what the ledger already booked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from composer_replication._io import JsonlAppender, read_jsonl

from .durable import GroupFsync
from .types import TeacherCallResult


def call_key(state_id: str, teacher_slug: str, prompt_hash: str) -> str:
    return hashlib.sha256(f"{state_id}\x00{teacher_slug}\x00{prompt_hash}".encode()).hexdigest()[:32]


def prompt_hash(payload: dict[str, Any]) -> str:
    """Hash of everything that determines a response: model, messages and sampling settings."""
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class ResultCache:
    def __init__(self, path: str | os.PathLike[str] | None, *, fsync: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.done: dict[str, TeacherCallResult] = {}
        self.n_error_rows = 0
        self.fell_back: set[str] = set()  # text-format answers of teachers whose endpoint refused tools
        if self.path is not None and self.path.exists():
            for rec in read_jsonl(self.path):
                key = rec.get("key")
                if key is None:
                    continue
                if rec.get("error") is None:
                    self.done[key] = _strip(rec)
                    if rec.get("fell_back"):
                        self.fell_back.add(key)
                else:
                    self.n_error_rows += 1
        self._out = JsonlAppender(self.path, fsync=False, fast=True) if self.path is not None else None
        self._durable = GroupFsync(self.path) if (fsync and self.path is not None) else None

    def get(self, key: str) -> TeacherCallResult | None:
        return self.done.get(key)

    def put(
        self, key: str, phash: str, result: TeacherCallResult, extra: dict[str, Any] | None = None
    ) -> None:
        """Append a row; ``extra`` (e.g. the call's ``tool_mode``) is written beside it, not returned."""
        if result["error"] is None:
            self.done[key] = result
            if (extra or {}).get("fell_back"):
                self.fell_back.add(key)
        if self._out is not None:
            self._out.write({**result, **(extra or {}), "key": key, "prompt_hash": phash})
            if self._durable is not None:
                self._durable.wrote()

    async def sync(self) -> None:
        """With ``fsync=True``: wait until every row written so far is on disk."""
        if self._durable is not None:
            await self._durable.sync()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
        if self._durable is not None:
            self._durable.close()


_FIELDS = TeacherCallResult.__annotations__


def _strip(rec: dict[str, Any]) -> TeacherCallResult:
    return {k: rec[k] for k in _FIELDS if k in rec}  # type: ignore[return-value]
