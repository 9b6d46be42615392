"""``manifest.json``: what a run directory holds and how far it got.

The manifest records the config, package versions, and for each stage its status, the hashes of the
inputs and of the config section it read, the hashes of its outputs, counts, and timings. It is
rewritten atomically after every change, so a crash leaves either the previous or the next version.
A stage is *current* when its recorded input hashes, section hash and output hashes all still match
the files on disk; the runner then skips it.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
_HASHED_PACKAGES = (
    "composer-replication",
    "torch",
    "transformers",
    "trl",
    "peft",
    "py-data-juicer",
    "pydantic",
)


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _HASHED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@dataclass
class StageRecord:
    """One stage's entry in the manifest."""

    status: str = "pending"  # pending | running | done | failed | disabled
    section_hash: str | None = None
    input_hashes: dict[str, str | None] = field(default_factory=dict)
    output_hashes: dict[str, str | None] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    error: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StageRecord:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


class Manifest:
    """In-memory view of ``<run>/manifest.json``; :meth:`save` writes it atomically."""

    def __init__(self, run_dir: str | os.PathLike[str], data: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.data: dict[str, Any] = data or {
            "schema": SCHEMA_VERSION,
            "created_at": time.time(),
            "stages": {},
        }
        self.stages: dict[str, StageRecord] = {
            k: StageRecord.from_dict(v) for k, v in self.data.get("stages", {}).items()
        }

    @property
    def path(self) -> Path:
        return self.run_dir / MANIFEST_NAME

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> Manifest:
        """Read the manifest of ``run_dir``; a missing one gives an empty manifest."""
        import json

        p = Path(run_dir) / MANIFEST_NAME
        if not p.exists():
            return cls(run_dir)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"{p}: not valid JSON ({exc}); it is written atomically, so this file was edited by hand"
            ) from None
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(
                f"{p}: manifest schema {data.get('schema')!r}, this version reads {SCHEMA_VERSION}"
            )
        return cls(run_dir, data)

    def stage(self, name: str) -> StageRecord:
        return self.stages.setdefault(name, StageRecord())

    def set_run_info(self, config: dict[str, Any], config_hash: str) -> None:
        self.data["config"] = config
        self.data["config_hash"] = config_hash
        self.data["versions"] = package_versions()

    def save(self) -> None:
        self.data["updated_at"] = time.time()
        self.data["stages"] = {k: v.__dict__ for k, v in self.stages.items()}
        atomic_write_json(self.path, self.data)
