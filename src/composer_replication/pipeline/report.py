"""``report.html``: one self-contained page per run with the plots and tables that matter.

Reads only files in the run directory (manifest, metrics, pairs, ledger, ``eval.json``) and writes
``report/report.html`` plus PNG plots beside it, referenced by relative paths, so the ``report/``
folder can be copied or served anywhere. Plots use matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import html
import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_text, read_jsonl
from composer_replication.pipeline.manifest import Manifest
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
    """Everything the report shows, as plain data (also used by ``status``)."""
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
    return {
        "manifest": m,
        "offline_metrics": _rows(run_dir / "train" / "offline" / "metrics.jsonl"),
        "grpo_metrics": _rows(run_dir / "train" / "grpo" / "metrics.jsonl"),
        "spend": dict(spend),
        "calls": dict(n_calls),
        "call_rows": calls,
        "pairs_per_teacher": per_teacher,
        "eval": json.loads(eval_path.read_text()) if eval_path.exists() else None,
        "tasks": read_task_eval(run_dir),
    }


def _eval_groups(ev: dict[str, Any]) -> tuple[list[str], dict[str, list[float]]]:
    metrics = [
        k
        for k in ("valid_rate", "tool_match_rate", "exact_match_rate", "sandbox_pass_rate")
        if k in ev.get("before", {})
    ]
    return metrics, {
        phase: [float(ev[phase].get(k) or 0.0) for k in metrics]
        for phase in ("before", "after")
        if phase in ev
    }


def write_report(run_dir: str | Path, *, title: str = "composer-replication run") -> Path:
    """Render ``<run>/report/report.html`` and its plots; returns the HTML path."""
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot("the report")
    d = collect(run_dir)
    figs: list[tuple[str, str]] = []

    def add(name: str, caption: str, ok: bool) -> None:
        if ok:
            figs.append((name, caption))

    add(
        "losses_offline.png",
        "Offline phase: per-channel losses",
        _line_plot(
            plt,
            _series(d["offline_metrics"], _is_loss),
            "offline phase: loss per channel",
            "loss",
            out / "losses_offline.png",
        ),
    )
    add(
        "losses_grpo.png",
        "GRPO phase: losses",
        _line_plot(
            plt, _series(d["grpo_metrics"], _is_loss), "GRPO phase: loss", "loss", out / "losses_grpo.png"
        ),
    )
    add(
        "reward.png",
        "GRPO phase: mean reward on the sandbox tasks per step, its parts, and frac_reward_zero_std (the "
        "share of groups whose completions all scored the same: those give the policy term no gradient)",
        _line_plot(
            plt, _series(d["grpo_metrics"], _is_reward), "GRPO phase: reward", "reward", out / "reward.png"
        ),
    )
    pt = d["pairs_per_teacher"]
    add(
        "pairs_per_teacher.png",
        "Preference pairs mined, by teacher in the agreeing majority",
        _bar_plot(
            plt,
            list(pt),
            {"pairs": [float(v) for v in pt.values()]},
            "pairs mined per teacher",
            "pairs",
            out / "pairs_per_teacher.png",
        ),
    )
    cum, total = [], 0.0
    for c in d["call_rows"]:
        total += float(c.get("cost_usd") or 0.0)
        cum.append(total)
    add(
        "spend.png",
        "Cumulative teacher spend (USD) over calls",
        _line_plot(
            plt,
            {"spend_usd": (list(range(1, len(cum) + 1)), cum)} if cum else {},
            "teacher spend",
            "USD",
            out / "spend.png",
        ),
    )
    if d["eval"]:
        labels, groups = _eval_groups(d["eval"])
        add(
            "eval.png",
            "Evaluation before and after training",
            _bar_plot(plt, labels, groups, "evaluation", "rate", out / "eval.png"),
        )
    atomic_write_text(out / "report.html", _html(title, d, figs))
    return out / "report.html"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _learning_html(d: dict[str, Any], m: Manifest) -> list[str]:
    """The page's opening: held-out before/after (n, spread) and what each loss channel contributed."""
    from composer_replication.pipeline.learning import channel_contributions, headline

    esc = html.escape
    out = ["<h2>What training did, on held-out sessions</h2>"]
    sites = (d["eval"] or {}).get("sites")
    lines, fell = headline(sites) if d["eval"] else (["Not evaluated yet."], [])
    if fell:
        out.append(
            '<p class="warn"><strong>Training made these held-out metrics worse: '
            f"{esc(', '.join(fell))}.</strong> The interval says whether the change is larger than "
            "the spread over sites.</p>"
        )
    elif sites:
        out.append("<p>No headline metric got worse on the held-out error sites.</p>")
    out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>")
    loss = m.data.get("config", {}).get("train", {}).get("loss", {})
    weights = {"lm_ce": 1.0, "sdpo_jsd": loss.get("sdpo", {}).get("weight", 0.0),
               "trace_replay_dpo": loss.get("preference", {}).get("weight", 0.0)}  # fmt: skip
    contrib = channel_contributions(d["offline_metrics"], weights)
    if contrib:
        heads = [
            "channel",
            "weight",
            "mean loss",
            "weighted term",
            "share of total",
            "first step",
            "last step",
        ]
        keys = ("mean_loss", "weighted", "share_of_total", "first", "last")
        rows = [
            [
                c["channel"],
                f"{c['weight']:g}",
                *(f"{c[k]:.1%}" if k == "share_of_total" else f"{c[k]:.4g}" for k in keys),
            ]
            for c in contrib
        ]
        out += ["<h3>Offline phase: what each loss channel contributed</h3>", _table(heads, rows)]
    return out


def _html(title: str, d: dict[str, Any], figs: list[tuple[str, str]]) -> str:
    esc = html.escape
    m: Manifest = d["manifest"]
    stage_rows = []
    for name, rec in m.stages.items():
        counts = ", ".join(f"{k}={v}" for k, v in rec.summary.items() if not isinstance(v, (dict, list)))
        # The report is written while its own stage runs: say so rather than show "running".
        status = "writing this page" if name == "report" and rec.status == "running" else rec.status
        stage_rows.append([name, status, counts, rec.error or ""])
    teachers = {t["slug"]: t for t in m.data.get("config", {}).get("replay", {}).get("teachers", [])}

    def backend(slug: str) -> str:
        t = teachers.get(slug, {})
        if t.get("backend") == "transformers":
            return f"in process: {t.get('model_path')}" + (
                f", T={t['temperature']}" if t.get("temperature") else ", greedy"
            )
        return t.get("base_url") or "OpenRouter"

    spend_rows = [[t, backend(t), d["calls"].get(t, 0), f"${s:.4f}"] for t, s in d["spend"].items()]
    parts = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Run directory <code>{esc(str(m.run_dir))}</code>, generated {esc(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}.</p>",
        *_learning_html(d, m),
        "<h2>Stages</h2>",
        _table(["stage", "status", "summary", "error"], stage_rows),
        "<h2>Teacher spend</h2>",
        _table(["teacher", "where", "calls", "spend"], spend_rows)
        if spend_rows
        else "<p>No teacher calls.</p>",
    ]
    ev = d["eval"]
    if ev:
        labels, groups = _eval_groups(ev)
        rows = [[k, *(f"{groups[p][i]:.3f}" for p in groups)] for i, k in enumerate(labels)]
        parts += [
            "<h2>Evaluation</h2>",
            f"<p>{esc(ev.get('note', ''))}</p>",
            _table(["metric", *groups], rows),
        ]
    from composer_replication.pipeline.task_report import run_section

    parts += run_section(d["tasks"])
    parts.append("<h2>Plots</h2>")
    for name, caption in figs:
        parts.append(
            f'<figure><img src="{esc(name)}" alt="{esc(caption)}"><figcaption>{esc(caption)}</figcaption></figure>'
        )
    versions = m.data.get("versions", {})
    parts += ["<h2>Versions</h2>", _table(["package", "version"], [[k, v] for k, v in versions.items()])]
    style = (
        "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
        "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;font-size:.9rem;text-align:left}"
        "figure{display:inline-block;margin:.5rem}img{max-width:100%}code{background:#f3f3f3}"
        ".warn{background:#fde8e8;border-left:4px solid #c0392b;padding:.4rem .6rem}"
    )
    # Records, once the page has loaded, how many images decoded: checked by the report test in headless Chromium.
    script = (
        "window.addEventListener('load',()=>{const i=[...document.images];"
        "document.body.setAttribute('data-images',i.filter(x=>x.complete&&x.naturalWidth>0).length+'/'+i.length)});"
    )
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
        f"<style>{style}</style><script>{script}</script></head><body>{''.join(parts)}</body></html>\n"
    )
