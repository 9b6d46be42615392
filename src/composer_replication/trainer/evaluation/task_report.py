"""``report.html`` of an ``eval`` run, and the task section of the pipeline's report.

`write_eval_report(result, out_dir)` renders ``out_dir/report.html`` from an ``eval.json`` result: the
policies' rates, a plot beside it (matplotlib, Agg: ``trainer.plots.pyplot``) of pass rate against
generated tokens per attempt, one point per policy (CursorBench's correctness-against-cost view), the
paired comparisons (``b - a`` per task, 95% interval) and a per-task table. `run_section(tasks)` is the pipeline report's view of the ``eval_tasks_*`` stages:
before/after pass rates on the run's tasks and their paired difference.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_text

__all__ = ["run_section", "write_eval_report"]

esc = html.escape
STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;color:#222}"
    "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
    "font-size:.85rem;text-align:left}figure{display:inline-block;margin:.5rem}img{max-width:100%}"
    "td.pass{background:#e6f4ea}td.fail{background:#fde8e8}td.infra{background:#f3f3f3}"
)


def _fmt(v: Any, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def _table(headers: list[str], rows: list[list[Any]], classes: list[list[str]] | None = None) -> str:
    head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
    body = ""
    for i, r in enumerate(rows):
        cls = classes[i] if classes else [""] * len(r)
        body += "<tr>" + "".join(
            f'<td class="{c}">{esc(str(x))}</td>' if c else f"<td>{esc(str(x))}</td>" for x, c in zip(r, cls)
        ) + "</tr>"  # fmt: skip
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _scatter(plt: Any, points: list[tuple[str, float, float]], out: Path) -> bool:
    if not points:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for name, x, y in points:
        ax.scatter([x], [y], s=40)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_title("pass rate against tokens")
    ax.set_xlabel("generated tokens per attempt (mean)")
    ax.set_ylabel("pass@1")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return True


def _figures(result: dict[str, Any], out: Path) -> list[tuple[str, str]]:
    from composer_replication.trainer.plots import pyplot

    pols = [p for p in result["policies"] if p["pass@1"] is not None]
    points = [(p["name"], float(p["tokens_per_attempt"] or 0.0), float(p["pass@1"])) for p in pols]
    if _scatter(pyplot("the eval report"), points, out / "pass_vs_tokens.png"):
        return [("pass_vs_tokens.png", "pass@1 against generated tokens per attempt, one point per policy")]
    return []


def _summary_table(result: dict[str, Any]) -> str:
    k = result["samples"]
    at_k = [f"pass@{k}"] if k > 1 else []
    heads = ["policy", "kind", "pass@1", *at_k, "checks passing", "tasks scored", "attempts scored",
             "infra failures", "tokens / attempt", "turns / attempt", "reward-hack attempts"]  # fmt: skip
    rows = [[p["name"], p["kind"], _fmt(p["pass@1"]), *(_fmt(p[c]) for c in at_k), _fmt(p["checks_share"]),
             p["tasks_scored"], p["attempts_scored"], p["infra_failures"], _fmt(p["tokens_per_attempt"], ".1f"),
             _fmt(p["turns_per_attempt"], ".1f"), p["reward_hack_attempts"]] for p in result["policies"]]  # fmt: skip
    return _table(heads, rows)


def comparison_html(c: dict[str, Any]) -> list[str]:
    """One paired comparison (`evaluation.tasks.compare`): the metric table and the per-task differences."""
    out = [f"<h3>{esc(c['b'])} against {esc(c['a'])}</h3>",
           f"<p>Per task, {esc(c['b'])} minus {esc(c['a'])}, over the {c['n_tasks']} tasks both scored; "
           "the 95% interval is Student's t over tasks (none with one task).</p>"]  # fmt: skip
    rows = []
    for m in ("pass@1", "checks_share"):
        s = c.get(m)
        if s:
            lo, hi = s["delta_ci95"]
            ci = "n/a" if lo is None else f"[{lo:+.3f}, {hi:+.3f}]"
            rows.append([m, _fmt(s["a"]), _fmt(s["b"]), f"{s['delta']:+.3f}", ci, s["n"]])
    out.append(_table(["metric", c["a"], c["b"], "change", "95% interval", "n tasks"], rows))
    if c["tasks_left_out"]:
        out.append(f"<p>Left out (no score on one side): {esc(', '.join(c['tasks_left_out']))}.</p>")
    return out


def _task_table(result: dict[str, Any]) -> str:
    pols = result["policies"]
    by_task: dict[str, dict[str, Any]] = {}
    for p in pols:
        for r in p["rows"]:
            by_task.setdefault(r["task"], {})[p["name"]] = r
    rows, classes = [], []
    for task, per in by_task.items():
        agents = [r for r in per.values() if "harness" in r]
        harness = (agents[0]["harness"] or "sandbox tools") if agents else ""
        cells, cls = [task, harness], ["", ""]
        for p in pols:
            r = per.get(p["name"])
            if r is None or not r["scored"]:
                cells.append("infrastructure failure" if r else "")
                cls.append("infra")
                continue
            hack = f", {r['reward_hack_attempts']} hack" if r["reward_hack_attempts"] else ""
            cells.append(f"{r['solved']}/{r['scored']} solved, checks {_fmt(r['checks_share'], '.2f')}, "
                         f"{r['tokens']} tok, {r['turns']} turns{hack}")  # fmt: skip
            cls.append("pass" if r["solved"] == r["scored"] else "fail")
        rows.append(cells)
        classes.append(cls)
    return _table(["task", "harness", *(p["name"] for p in pols)], rows, classes)


def write_eval_report(result: dict[str, Any], out_dir: Path, *, title: str = "eval") -> Path:
    """Render ``out_dir/report.html`` (module docstring) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = _figures(result, out_dir)
    parts = [f"<h1>{esc(title)}</h1>",
             f"<p>{result['n_tasks']} tasks in <code>{esc(Path(result['tasks_dir']).name)}</code>, "
             f"{result['samples']} attempt(s) each. Infrastructure failures are counted apart and left out "
             "of every rate.</p>", "<h2>Policies</h2>", _summary_table(result)]  # fmt: skip
    for name, caption in figs:
        parts.append(f'<figure><img src="{esc(name)}" alt="{esc(caption)}"><figcaption>{esc(caption)}'
                     "</figcaption></figure>")  # fmt: skip
    if result.get("comparisons"):
        parts.append("<h2>Paired comparison</h2>")
        for c in result["comparisons"]:
            parts += comparison_html(c)
    parts += ["<h2>Per task</h2>", _task_table(result)]
    if result["malformed"]:
        parts += ["<h2>Task folders that did not load</h2>",
                  _table(["task", "reason"], [[m["task"], m["reason"]] for m in result["malformed"]])]  # fmt: skip
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")  # fmt: skip
    atomic_write_text(out_dir / "report.html", page)
    return out_dir / "report.html"


def run_section(tasks: dict[str, Any] | None) -> list[str]:
    """The pipeline report's section on the run's tasks (``eval/eval.json``'s ``tasks``: the student
    before and the trained model after, and ``before_after``, their `evaluation.tasks.compare`)."""
    if not tasks:
        return []
    out = ["<h2>Your tasks, before and after training</h2>"]
    rows = []
    for phase in ("before", "after"):
        p = tasks.get(phase)
        if p:
            rows.append([phase, p["name"], _fmt(p["pass@1"]), _fmt(p["checks_share"]), p["tasks_scored"],
                         p["infra_failures"], _fmt(p["tokens_per_attempt"], ".1f"), p["reward_hack_attempts"]])  # fmt: skip
    out.append(_table(["phase", "model", "pass@1", "checks passing", "tasks scored", "infra failures",
                       "tokens / attempt", "reward-hack attempts"], rows))  # fmt: skip
    if tasks.get("before_after"):
        out += comparison_html(tasks["before_after"])
    out.append("<p>Each phase's report, with the per-task table: <code>tasks/eval_before/report.html</code>, "
               "<code>tasks/eval_after/report.html</code>.</p>")  # fmt: skip
    return out
