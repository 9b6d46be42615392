"""The run config's ``tasks`` section: tasks from your sessions, mined, scored before and after training.

With ``sessions`` (mined by ``tasks mine`` into ``RUN/tasks/mined``) or a ready ``dir``, ``run`` chains
mine -> eval before (the student) -> train -> eval after (the trained model) on the same tasks, and the
report shows both pass rates and their paired per-task difference. The GRPO phase trains on these tasks
when ``grpo.tasks`` is unset and ``train`` is on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from composer_replication.config.base import StrictModel

__all__ = ["MINED", "TasksConfig", "resolve_task_paths", "run_task_dir"]

MINED = ("tasks", "mined")  # where a run mines tasks.sessions, under its run directory


class TasksConfig(StrictModel):
    """Tasks from your sessions (docs/tasks.md): where they come from, and how the models are scored on them."""

    sessions: list[str] = Field(
        default_factory=list,
        description="Session files or folders to mine tasks from (`tasks mine`, into `RUN/tasks/mined`); their "
        "repositories must be on this machine. Relative paths are relative to the config file.",
    )
    dir: str | None = Field(
        None,
        description="A ready task directory instead (`tasks mine --out`, or folders in the `task.json` layout).",
    )
    repo_map: list[str] = Field(
        default_factory=list,
        description="`OLD=NEW` prefixes for checkouts that moved (`tasks mine --repo-map`).",
    )
    check_timeout_s: float = Field(120.0, gt=0, description="Seconds per check run while mining.")
    pip_args: list[str] = Field(
        default_factory=list, description="Extra `pip install` options for the tasks' environments."
    )
    sandbox: Literal["bwrap", "docker"] | None = Field(
        None, description="Sandbox backend for mining and scoring; None: what is there."
    )
    samples: int = Field(1, ge=1, description="Attempts per task and model (pass@K with K = samples).")
    harness: Literal["claude_code", "codex"] | None = Field(
        None,
        description="Tools of tasks whose provenance names no harness; None: the sandbox's four tools "
        "(a mined task runs in its session's own harness).",
    )
    max_turns: int = Field(8, ge=1, description="Model turns per attempt.")
    max_tokens: int | None = Field(None, ge=1, description="Generated tokens per attempt; None: no cap.")
    max_wall_s: float | None = Field(None, gt=0, description="Seconds per attempt; None: no cap.")
    max_new_tokens: int = Field(256, ge=1, description="Tokens per model turn.")
    temperature: float = Field(
        0.0,
        ge=0.0,
        description="Sampling temperature of the attempts; 0 is greedy (use > 0 with samples > 1).",
    )
    train: bool = Field(
        True, description="The GRPO phase trains on these tasks when `grpo.tasks` is unset (`grpo.enabled`)."
    )

    @field_validator("repo_map")
    @classmethod
    def _pairs(cls, v: list[str]) -> list[str]:
        bad = [e for e in v if not all(part.strip() for part in e.partition("=")[::2])]
        if bad:
            raise ValueError(f"{bad[0]!r}: expected OLD=NEW (a recorded path prefix and where it is now)")
        return v

    @field_validator("dir")
    @classmethod
    def _dir_exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_dir():
            raise ValueError(
                f"{v}: no such task directory (mine one with `tasks mine --out`, or use `sessions`)"
            )
        return v

    @model_validator(mode="after")
    def _one_source(self) -> TasksConfig:
        if self.sessions and self.dir:
            raise ValueError("set tasks.sessions (mine them) or tasks.dir (a ready task directory), not both")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.sessions or self.dir)


def resolve_task_paths(raw: dict[str, Any], base: Path) -> None:
    """``tasks.sessions`` and ``tasks.dir`` given relative, resolved against the config file's directory."""
    section = raw.get("tasks")
    if not isinstance(section, dict):
        return

    def resolve(p: Any) -> Any:
        return str(base / os.path.expanduser(p)) if isinstance(p, str) else p

    if isinstance(section.get("sessions"), list):
        section["sessions"] = [resolve(p) for p in section["sessions"]]
    section["dir"] = resolve(section.get("dir"))


def run_task_dir(config: Any, run_dir: Path) -> Path | None:
    """A run's task directory: the mined one (``tasks.sessions``), else ``tasks.dir``, else ``grpo.tasks``
    when it names a directory; None when the run (a ``RunConfig``) has none."""
    if config.tasks.sessions:
        return run_dir.joinpath(*MINED)
    if config.tasks.dir:
        return Path(config.tasks.dir)
    return Path(config.grpo.tasks) if isinstance(config.grpo.tasks, str) else None
