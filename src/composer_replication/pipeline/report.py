"""``report.html``: one self-contained page per run with the plots and tables that matter.

Reads only files in the run directory (manifest, metrics, pairs, ledger, ``eval.json``) and writes
``report/report.html`` plus PNG plots beside it, referenced by relative paths, so the ``report/``
folder can be copied or served anywhere. Plots use matplotlib's Agg backend (no display needed).

The page shows one evaluation: the paired before/after comparison at every held-out error site
(``eval.json`` ``sites``, each metric with its n and 95% interval) and the sandbox pass rate over its
tasks (with n); the greedy answers at the first ``evaluate.max_sites`` sites are shown as answers to
read, not as rates. The page itself is assembled in ``pipeline.report_html``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_text, read_jsonl
from composer_replication.pipeline.learning import RECOVERY_SOURCE, eval_rates
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.report_html import page
from composer_replication.pipeline.task_stages import read_task_eval
from composer_replication.trainer.plots import pyplot

LOSS_KEYS = ("total", "lm_ce", "sdpo_jsd", "trace_replay_dpo", "loss")


def _rows(path: Path) -> list[dict[str, Any]]:
    return list(read_jsonl(path)) if path.exists() else []


def _series(rows: list[dict[str, Any]], want: Any) -> dict[str, tuple[list[float], list[float]]]:
    """{key: (steps, values)} for numeric keys accepted by ``want(key)``."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for i, r in enumerate(rows):
        step = r.get("step", r.get("global_step", i))
        for k, v in r.items():
            if (
                k in ("step", "global_step", "epoch")
                or isinstance(v, bool)
                or not isinstance(v, (int, float))
            ):
                continue
            if not want(k) or not math.isfinite(v):
                continue
            xs, ys = out.setdefault(k, ([], []))
            xs.append(float(step))
            ys.append(float(v))
    return out


def _is_loss(k: str) -> bool:
    leaf = k.split("/")[-1]
    return leaf in LOSS_KEYS or "loss" in k


def _is_reward(k: str) -> bool:
    # the mean reward, its parts (shaped reward), and the share of groups with no reward spread: at 1.0
    # every group is all-equal and the policy term has no gradient
    return k == "frac_reward_zero_std" or ("reward" in k and "std" not in k)


def _line_plot(
    plt: Any, series: dict[str, tuple[list[float], list[float]]], title: str, ylabel: str, out: Path
) -> bool:
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for k, (xs, ys) in sorted(series.items()):
        ax.plot(xs, ys, marker="o", markersize=3, label=k)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


def _bar_plot(
    plt: Any, labels: list[str], groups: dict[str, list[float]], title: str, ylabel: str, out: Path
) -> bool:
    if not labels:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    width = 0.8 / max(1, len(groups))
    for j, (name, vals) in enumerate(groups.items()):
        ax.bar([i + j * width for i in range(len(labels))], vals, width=width, label=name)
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=15, ha="right", fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if len(groups) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


def collect(run_dir: Path) -> dict[str, Any]:
    """Everything the report shows, as plain data."""
    m = Manifest.load(run_dir)
    calls = _rows(run_dir / "replay" / "teacher_calls.jsonl")
    spend: dict[str, float] = defaultdict(float)
    n_calls: dict[str, int] = defaultdict(int)
    for c in calls:
        spend[c["teacher_slug"]] += float(c.get("cost_usd") or 0.0)
        n_calls[c["teacher_slug"]] += 1
    per_teacher_path = run_dir / "pairs" / "per_teacher.json"
    per_teacher = json.loads(per_teacher_path.read_text()) if per_teacher_path.exists() else {}
    eval_path = run_dir / "eval" / "eval.json"
    pairs_summary = m.stages["pairs"].summary if "pairs" in m.stages else {}
    norm_summary = m.stages["normalize"].summary if "normalize" in m.stages else {}
    sources = {f"teacher consensus: {t}": int(n) for t, n in per_teacher.items()}
    if pairs_summary.get("recovery_pairs") is not None:
        sources[RECOVERY_SOURCE] = int(pairs_summary["recovery_pairs"])
    return {
        "manifest": m,
        "offline_metrics": _rows(run_dir / "train" / "offline" / "metrics.jsonl"),
        "grpo_metrics": _rows(run_dir / "train" / "grpo" / "metrics.jsonl"),
        "spend": dict(spend),
        "calls": dict(n_calls),
        "call_rows": calls,
        "pairs_per_teacher": per_teacher,
        # every pair the preference channel could train on, by where it came from (teachers credited per
        # agreeing teacher), and how many normalisation kept: what DPO trained on
        "pair_sources": sources,
        "teacher_pairs": pairs_summary.get("pairs"),
        "pairs_trained": norm_summary.get("pairs_out"),
        "eval": json.loads(eval_path.read_text()) if eval_path.exists() else None,
        "tasks": read_task_eval(run_dir),
    }


def _figures(plt: Any, d: dict[str, Any], out: Path) -> list[tuple[str, str]]:
    figs: list[tuple[str, str]] = []

    def add(name: str, caption: str, ok: bool) -> None:
        if ok:
            figs.append((name, caption))

    add("losses_offline.png", "Offline phase: per-channel losses per step",
        _line_plot(plt, _series(d["offline_metrics"], _is_loss), "offline phase: loss per channel", "loss",
                   out / "losses_offline.png"))  # fmt: skip
    add("losses_grpo.png", "GRPO phase: losses per step",
        _line_plot(plt, _series(d["grpo_metrics"], _is_loss), "GRPO phase: loss", "loss",
                   out / "losses_grpo.png"))  # fmt: skip
    add("reward.png", "GRPO phase: mean reward on the sandbox tasks per step, its parts, and "
        "frac_reward_zero_std (the share of groups whose completions all scored the same: those give the "
        "policy term no gradient)",
        _line_plot(plt, _series(d["grpo_metrics"], _is_reward), "GRPO phase: reward", "reward",
                   out / "reward.png"))  # fmt: skip
    src = d["pair_sources"]
    add("pairs_per_teacher.png", "Preference pairs by source: teacher consensus (each teacher in the "
        "agreeing majority credited) and the training sessions' recorded recoveries (pairs.recovery)",
        _bar_plot(plt, list(src), {"pairs": [float(v) for v in src.values()]}, "preference pairs by source",
                  "pairs", out / "pairs_per_teacher.png") if any(src.values()) else False)  # fmt: skip
    cum, total = [], 0.0
    for c in d["call_rows"]:
        total += float(c.get("cost_usd") or 0.0)
        cum.append(total)
    add("spend.png", "Cumulative teacher spend (USD) over calls",
        _line_plot(plt, {"spend_usd": (list(range(1, len(cum) + 1)), cum)}, "teacher spend", "USD",
                   out / "spend.png") if total > 0 else False)  # fmt: skip
    if d["eval"]:
        rates = eval_rates(d["eval"])
        labels = [f"{m} (n={n})" for m, _, _, n in rates]
        groups = {"before": [b for _, b, _, _ in rates], "after": [a for _, _, a, _ in rates]}
        add("eval.png", "Held-out rates before and after training (n under each)",
            _bar_plot(plt, labels, groups, "evaluation: rates", "rate", out / "eval.png"))  # fmt: skip
    return figs


def write_report(run_dir: str | Path, *, title: str = "composer-replication run") -> Path:
    """Render ``<run>/report/report.html`` and its plots; returns the HTML path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.png"):  # a plot this run no longer draws must not linger beside the page
        stale.unlink()
    d = collect(run_dir)
    figs = _figures(pyplot("the report"), d, out)
    atomic_write_text(out / "report.html", page(title, d, figs))
    return out / "report.html"
