"""The HTML of ``report.html`` (``pipeline.report`` gathers the data and draws the plots).

One evaluation, one set of numbers: every rate on the page carries its n, a change whose 95% interval
crosses 0 is called within noise, and what a plot cannot say by itself (a GRPO phase without policy
gradient, a loss that ends above its start, pairs that came from the sessions rather than teachers, a
run that paid no teacher) is said in words beside it.
"""

from __future__ import annotations

import html
import time
from typing import Any

from composer_replication.pipeline.learning import (
    HEADLINE,
    RECOVERY_SOURCE,
    channel_contributions,
    channel_readings,
    count,
    eval_rates,
    grpo_reading,
    headline,
    verdict,
)
from composer_replication.pipeline.manifest import Manifest

esc = html.escape
ANSWER_CHARS = 400  # sample answers are cut for the page; eval.json keeps them whole


def table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{esc(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ul(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"


def learning_section(d: dict[str, Any], m: Manifest) -> list[str]:
    """The page's opening: held-out before/after (n, interval, reading) and what each loss channel did."""
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
    out.append(_ul(lines))
    noise = [
        k for k, low in HEADLINE.items()
        if sites and k in sites["metrics"] and verdict(sites["metrics"][k], low).startswith("within noise")
    ]  # fmt: skip
    if noise:
        out.append(
            f"<p>Within noise: {esc(', '.join(noise))}: the 95% interval of the change crosses 0, so these "
            "sites cannot tell the change from no change.</p>"
        )
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
            [c["channel"], f"{c['weight']:g}",
             *(f"{c[k]:.1%}" if k == "share_of_total" else f"{c[k]:.4g}" for k in keys)]
            for c in contrib
        ]  # fmt: skip
        out += ["<h3>Offline phase: what each loss channel contributed</h3>", table(heads, rows)]
        readings = channel_readings(d["offline_metrics"])
        if readings:
            out.append(_ul(readings))
    return out


def evaluation_section(ev: dict[str, Any]) -> list[str]:
    """One table: every held-out metric (n sites, interval, reading) and the sandbox pass rate (n tasks);
    then the greedy sample answers, to read."""
    rows = []
    metrics = (ev.get("sites") or {}).get("metrics") or {}
    for k, low in HEADLINE.items():
        if k in metrics:
            s = metrics[k]
            lo, hi = s["delta_ci95"]
            rows.append([k, f"{s['before']:.4g}", f"{s['after']:.4g}", f"{s['delta']:+.3g}",
                         f"[{lo:+.3g}, {hi:+.3g}]", count(s["n"], "site"), verdict(s, low)])  # fmt: skip
    for label, b, a, n in eval_rates(ev):
        if label == "sandbox_pass_rate":
            rows.append([label, f"{b:.3g}", f"{a:.3g}", f"{a - b:+.3g}", "", n,
                         "too few tasks for an interval: one greedy rollout per task"])  # fmt: skip
    out = [
        "<h2>Evaluation</h2>",
        "<p>Before and after training, paired over the held-out error sites (the sessions held out of "
        "replay and training; per metric, n counts the sites it applies to: JSD needs a hint) and over the "
        "sandbox tasks. <em>valid</em>: a greedy answer that ended within the token budget and is a "
        "well-formed action; <em>tool match</em>: the same tool sequence as the recorded recovery.</p>",
        table(["metric", "before", "after", "change", "95% interval", "n", "reading"], rows)
        if rows
        else "<p>No held-out error sites and no sandbox tasks: nothing was measured.</p>",
    ]
    return out + _sample_answers(ev)


SAMPLES = 3  # answers of the site comparison shown when evaluate.max_sites generated none of its own


def _answer(text: str, valid: Any) -> str:
    cut = text[:ANSWER_CHARS] + (" [...]" if len(text) > ANSWER_CHARS else "")
    return f"{'valid' if valid else 'not valid'}: {cut}"


def _sample_answers(ev: dict[str, Any]) -> list[str]:
    """The greedy block's answers (``evaluate.max_sites``), else the first answers the table scored."""
    before = {r["state_id"]: r for r in (ev.get("before") or {}).get("sites") or []}
    after = {r["state_id"]: r for r in (ev.get("after") or {}).get("sites") or []}
    ids = [i for i in before if i in after]
    if ids:
        rows = [[i, _answer(before[i]["output"], before[i].get("valid")),
                 _answer(after[i]["output"], after[i].get("valid"))] for i in ids]  # fmt: skip
        what = f"at the first {count(len(ids), 'held-out error state')} (evaluate.max_sites)"
    else:
        s = ev.get("sites") or {}
        answers, valid = s.get("answers") or {}, {p: (s.get("per_site") or {}).get(p, {}).get("valid_rate")
                                                  for p in ("before", "after")}  # fmt: skip
        if not answers.get("before") or not answers.get("after"):
            return []
        n = min(SAMPLES, len(s["site_ids"]))
        rows = [[s["site_ids"][i], *(_answer(answers[p][i], (valid[p] or [0] * n)[i]) for p in ("before", "after"))]
                for i in range(n)]  # fmt: skip
        what = f"at {n} of the {count(s['n_sites'], 'held-out error site')} the table scores"
    return [
        "<h3>Sample answers</h3>",
        f"<p>Greedy answers {what}, before and after, to read what the model says: they are examples, not "
        "the measurement (the table above is).</p>",
        table(["site", "before", "after"], rows),
    ]


def spend_section(d: dict[str, Any], m: Manifest) -> list[str]:
    teachers = {t["slug"]: t for t in m.data.get("config", {}).get("replay", {}).get("teachers", [])}

    def where(slug: str) -> str:
        t = teachers.get(slug, {})
        if t.get("backend") == "transformers":
            return f"in process: {t.get('model_path')}" + (
                f", T={t['temperature']}" if t.get("temperature") else ", greedy"
            )
        return t.get("base_url") or "OpenRouter"

    rows = [[t, where(t), d["calls"].get(t, 0), f"${s:.4f}"] for t, s in d["spend"].items()]
    out = ["<h2>Teacher spend</h2>"]
    if not rows:
        return out + ["<p>No teacher calls.</p>"]
    out.append(table(["teacher", "where", "calls", "spend"], rows))
    if sum(d["spend"].values()) == 0:
        out.append(
            f"<p>No paid teachers in this run: its {sum(d['calls'].values())} teacher calls cost $0 (so no "
            "spend plot).</p>"
        )
    return out


def pairs_section(d: dict[str, Any]) -> list[str]:
    src = d["pair_sources"]
    if not src:
        return []
    recovered = src.get(RECOVERY_SOURCE)
    parts = [f"{d['teacher_pairs']} from teacher consensus"] if d["teacher_pairs"] is not None else []
    if recovered is not None:
        parts.append(f"{recovered} recorded recoveries from the training sessions (pairs.recovery: the "
                     "failed call rejected, the agent's recovery chosen; no teacher involved)")  # fmt: skip
    text = f"Preference pairs mined: {'; '.join(parts)}." if parts else ""
    if d["pairs_trained"] is not None:
        text += f" After normalisation the preference channel (DPO) trained on {d['pairs_trained']}."
    return ["<h2>Preference pairs</h2>", f"<p>{esc(text)}</p>"]


def page(title: str, d: dict[str, Any], figs: list[tuple[str, str]]) -> str:
    from composer_replication.trainer.evaluation.task_report import run_section

    m: Manifest = d["manifest"]
    stage_rows = []
    for name, rec in m.stages.items():
        counts = ", ".join(f"{k}={v}" for k, v in rec.summary.items() if not isinstance(v, (dict, list)))
        # The report is written while its own stage runs: say so rather than show "running".
        status = "writing this page" if name == "report" and rec.status == "running" else rec.status
        stage_rows.append([name, status, counts, rec.error or ""])
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    parts = [
        f"<h1>{esc(title)}</h1>",
        f"<p>Run directory <code>{esc(str(m.run_dir))}</code>, generated {esc(stamp)}.</p>",
        *learning_section(d, m),
        *(evaluation_section(d["eval"]) if d["eval"] else []),
        *run_section(d.get("tasks")),
        "<h2>Stages</h2>",
        table(["stage", "status", "summary", "error"], stage_rows),
        *spend_section(d, m),
        *pairs_section(d),
    ]
    grpo = grpo_reading(d["grpo_metrics"])
    if grpo:
        parts += ["<h2>GRPO phase</h2>", _ul(grpo)]
    parts.append("<h2>Plots</h2>")
    for name, caption in figs:
        parts.append(
            f'<figure><img src="{esc(name)}" alt="{esc(caption)}"><figcaption>{esc(caption)}</figcaption></figure>'
        )
    versions = m.data.get("versions", {})
    parts += ["<h2>Versions</h2>", table(["package", "version"], [[k, v] for k, v in versions.items()])]
    style = (
        "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}"
        "table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;font-size:.9rem;text-align:left;vertical-align:top}"
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
