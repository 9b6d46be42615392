"""data-juicer normalisation of preference pairs (API reference §7).

Pairs become flat records (``text`` = context + chosen + rejected for duplicate detection,
``chosen``, ``rejected``), the recipe's ops run in order through data-juicer's own
``NestedDataset.process`` (the call ``DefaultExecutor.run`` makes), one op at a time, so every dropped
record is attributed to the op that dropped it. We do not go through ``data_juicer.config`` because
its logger setup redirects this process's ``sys.stdout``/``sys.stderr`` for good; the recipe file is
data-juicer's own YAML format (``process:`` list of ``{op_name: {args}}``).

Guarantees: ``skip_op_error`` is forced off (a recipe asking for it is rejected), so a failing op
raises instead of silently dropping records; data-juicer may not install packages at run time
(see ``_dj_guard``); ``records_in == records_out + sum(dropped_by_op)`` is checked on every run.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from composer_replication.config.run import MAX_TOTAL_USD
from composer_replication.teacher_replay.types import DPOPair, TeacherCallResult

_RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes" / "replaysim"


@dataclass
class NormalizedDPOPair:
    state_id: str
    state_messages: list[dict[str, Any]]
    chosen_messages: list[dict[str, Any]]
    rejected_messages: list[dict[str, Any]]
    n_teachers_agreeing: int
    metadata: dict[str, Any]


@dataclass
class NormalizeReport:
    records_in: int = 0
    records_out: int = 0
    dropped_by_op: dict[str, int] = field(default_factory=dict)
    dropped: list[dict[str, str]] = field(default_factory=list)  # {"state_id", "op"}


def _last_user(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content", "")) for m in reversed(messages) if m.get("role") == "user"), "")


def _as_pair(p: Any, i: int) -> dict[str, Any]:
    if isinstance(p, NormalizedDPOPair):
        raise TypeError(f"pair #{i} is already a NormalizedDPOPair; pass DPOPair dicts")
    if not isinstance(p, dict):
        raise TypeError(f"pair #{i}: expected a DPOPair dict, got {type(p).__name__}")
    missing = [k for k in ("state_id", "chosen", "rejected") if k not in p]
    if missing:
        raise ValueError(f"pair #{i} ({p.get('state_id', '?')}): missing field(s) {missing}")
    return p


def _to_normalized(p: dict[str, Any], metadata: dict[str, Any]) -> NormalizedDPOPair:
    return NormalizedDPOPair(
        state_id=str(p["state_id"]),
        state_messages=list(p.get("state_messages") or []),
        chosen_messages=[{"role": "assistant", "content": p["chosen"]}],
        rejected_messages=[{"role": "assistant", "content": p["rejected"]}],
        n_teachers_agreeing=int(p.get("n_teachers_agreeing", 0)),
        metadata={**metadata, **({"tools": p["tools"]} if p.get("tools") else {})},  # the state's schemas
    )


class DJNormalizer:
    """Dedup and filter preference pairs with a data-juicer recipe (or pass them through)."""

    DEFAULT_RECIPE: ClassVar[Path] = _RECIPE_DIR / "default.yaml"

    def __init__(self, recipe_path: str | os.PathLike[str] | None = None, *, skip_dj: bool = False) -> None:
        self.skip_dj = skip_dj
        self.recipe_path = Path(recipe_path) if recipe_path is not None else self.DEFAULT_RECIPE
        self.last_report: NormalizeReport | None = None
        if skip_dj:
            return
        if not self.recipe_path.is_file():
            raise FileNotFoundError(f"{self.recipe_path}: data-juicer recipe not found")
        from ._dj_guard import install_guard

        install_guard()  # RuntimeError (naming the extra) if data_juicer is not importable
        self.recipe = self._load_recipe(self.recipe_path)

    @staticmethod
    def _load_recipe(path: Path) -> dict[str, Any]:
        try:
            cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        if cfg.get("skip_op_error", False):
            raise ValueError(
                f"{path}: skip_op_error: true makes data-juicer drop records silently when an op fails; set it to false"
            )
        process = cfg.get("process")
        if not isinstance(process, list) or not process:
            raise ValueError(f"{path}: needs a non-empty 'process:' list of {{op_name: {{args}}}} entries")
        from data_juicer.ops.base_op import OPERATORS

        for j, entry in enumerate(process):
            if not isinstance(entry, dict) or len(entry) != 1:
                raise ValueError(f"{path}: process[{j}] must be a one-key mapping {{op_name: {{args}}}}")
            ((name, args),) = entry.items()
            if name not in OPERATORS.modules:
                raise ValueError(f"{path}: process[{j}]: unknown data-juicer op {name!r}")
            if args is not None and not isinstance(args, dict):
                raise ValueError(f"{path}: process[{j}] ({name}): arguments must be a mapping")
            if (args or {}).get("skip_op_error"):
                raise ValueError(f"{path}: process[{j}] ({name}): skip_op_error must be false")
        return cfg

    def normalize(self, pairs: Iterable[DPOPair | dict[str, Any]]) -> list[NormalizedDPOPair]:
        rows = [_as_pair(p, i) for i, p in enumerate(pairs)]
        report = NormalizeReport(records_in=len(rows))
        if self.skip_dj:
            report.records_out = len(rows)
            self.last_report = report
            return [_to_normalized(p, {"skipped": True}) for p in rows]
        if not rows:
            self.last_report = report
            return []
        kept_ids, report = self._run(rows, report)
        self.last_report = report
        meta = {
            "skipped": False,
            "recipe": str(self.recipe_path),
            "ops": [next(iter(e)) for e in self.recipe["process"]],
        }
        return [_to_normalized(rows[i], meta) for i in kept_ids]

    def _run(self, pairs: list[dict[str, Any]], report: NormalizeReport) -> tuple[list[int], NormalizeReport]:
        from data_juicer.core.data import NestedDataset
        from data_juicer.ops import load_ops

        records = [
            {
                "rid": i,
                "text": f"{_last_user(p.get('state_messages') or [])}\n\nCHOSEN:\n{p['chosen']}\n\nREJECTED:\n{p['rejected']}",
                "chosen": str(p["chosen"]),
                "rejected": str(p["rejected"]),
            }
            for i, p in enumerate(pairs)
        ]
        text_key = self.recipe.get("text_keys", "text")
        process: list[Any] = []
        names: list[str] = []
        for entry in self.recipe["process"]:
            ((name, args),) = entry.items()
            args = {"text_key": text_key, **(args or {}), "skip_op_error": False, "num_proc": 1}
            process.append({name: args})
            names.append(name if name not in names else f"{name}#{names.count(name) + 1}")
        with _quiet_dj():
            ops = load_ops(process)
            ds = NestedDataset.from_list(records)
            for name, op in zip(names, ops):
                before = set(ds["rid"])
                ds = ds.process([op], open_monitor=False)
                after = set(ds["rid"])
                if not after <= before:
                    raise RuntimeError(
                        f"data-juicer op {name} added records; only filters and dedups are supported"
                    )
                gone = sorted(before - after)
                report.dropped_by_op[name] = len(gone)
                report.dropped += [{"state_id": str(pairs[i]["state_id"]), "op": name} for i in gone]
            kept = sorted(ds["rid"])
        report.records_out = len(kept)
        assert report.records_in == report.records_out + sum(report.dropped_by_op.values())
        return kept, report


class _quiet_dj:
    """Silence data-juicer's loguru messages and the datasets progress bars for the duration.

    Only data-juicer's own logger namespace is disabled: the host's loguru handlers stay as they are.
    """

    def __enter__(self) -> None:
        from datasets.utils import logging as ds_logging
        from loguru import logger

        self._bars_enabled = ds_logging.is_progress_bar_enabled()
        ds_logging.disable_progress_bar()
        logger.disable("data_juicer")

    def __exit__(self, *exc: object) -> None:
        from datasets.utils import logging as ds_logging
        from loguru import logger

        logger.enable("data_juicer")
        if self._bars_enabled:
            ds_logging.enable_progress_bar()


async def replay_and_normalize_trace(
    *,
    states: Any,
    teachers: Any = None,
    agreement_threshold: int = 2,
    max_total_usd: float = MAX_TOTAL_USD,
    normalizer: DJNormalizer | None = None,
    **replay_kwargs: Any,
) -> tuple[list[TeacherCallResult], list[NormalizedDPOPair]]:
    """Replay → consensus pairs → normalise. ``replay_kwargs`` go to ``replay_trace``."""
    from composer_replication.teacher_replay import DEFAULT_TEACHERS, extract_dpo_pairs, replay_trace

    teachers = tuple(DEFAULT_TEACHERS) if teachers is None else teachers
    normalizer = normalizer if normalizer is not None else DJNormalizer()
    raw = await replay_trace(states, teachers, max_total_usd=max_total_usd, **replay_kwargs)
    pairs = extract_dpo_pairs(states, raw, agreement_threshold=agreement_threshold)
    # data-juicer work is CPU-bound and synchronous: keep it off the event loop.
    normalized = await asyncio.to_thread(normalizer.normalize, pairs)
    return raw, normalized


def replay_and_normalize_trace_sync(
    *args: Any, **kwargs: Any
) -> tuple[list[TeacherCallResult], list[NormalizedDPOPair]]:
    """``asyncio.run(replay_and_normalize_trace(...))`` for callers without an event loop."""
    return asyncio.run(replay_and_normalize_trace(*args, **kwargs))
