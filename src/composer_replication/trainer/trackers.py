"""``logging.report_to`` for the offline trainer: the same tracker names TRL/transformers accept.

``metrics.jsonl`` is always written; each named tracker additionally receives every logged row.
(In ``grpo`` mode the names go straight to ``GRPOConfig.report_to``.) A tracker whose package is
missing fails at start with the pip command, not half-way through a run.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from composer_replication._extras import require

SUPPORTED = ("tensorboard", "wandb", "trackio")


class _Tensorboard:
    def __init__(self, out_dir: Path, config: dict) -> None:
        require("tensorboard", purpose="report_to=tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in row.items():
            if isinstance(value, int | float) and key != "step":
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _WandbLike:
    """wandb and trackio share ``init(project=, config=)`` / ``log(dict, step=)`` / ``finish()``."""

    def __init__(self, name: str, out_dir: Path, config: dict) -> None:
        require(name, purpose=f"report_to={name}")
        self.mod = importlib.import_module(name)
        self.mod.init(project="composer-replication", name=out_dir.name, config=config)

    def log(self, row: dict[str, Any], step: int) -> None:
        self.mod.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self) -> None:
        self.mod.finish()


def open_trackers(report_to: Sequence[str], out_dir: Path, config: dict) -> list[Any]:
    unknown = sorted(set(report_to) - set(SUPPORTED) - {"none"})
    if unknown:
        raise ValueError(f"logging.report_to: unknown tracker(s) {unknown}; choose from {SUPPORTED}")
    out: list[Any] = []
    for name in report_to:
        if name == "tensorboard":
            out.append(_Tensorboard(out_dir, config))
        elif name in ("wandb", "trackio"):
            out.append(_WandbLike(name, out_dir, config))
    return out
