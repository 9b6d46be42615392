"""Did the run teach? Before/after at held-out error sites with n and spread, and per-channel shares.

``trainer.evaluation.paired.site_comparison`` measures the student before training and the trained model
on the error sites of the held-out traces (``heldout_traces``) and summarises each metric as a paired
comparison over sites (``trainer.evaluation.paired.paired``).
``channel_contributions`` reads the offline phase's ``metrics.jsonl``: each channel's mean loss, its
weight, and its weighted share of the total loss. ``headline`` turns both into the lines the report
opens with, and names every headline metric that got worse; ``verdict`` reads one change against its
interval (a change whose 95% interval crosses 0 is within noise). ``channel_readings`` and
``grpo_reading`` put in words what the loss and reward curves show.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from composer_replication.trainer.evaluation.paired import HEADLINE


def heldout_traces(run_dir: Path) -> list[dict]:
    """The ingested traces (``TraceExample`` rows) that the split kept out of training."""
    from composer_replication.ingestion.store import EXAMPLES_FORMAT, open_store, read_refs

    train = {t["trace_id"] for t in read_refs(run_dir / "split" / "train_traces.jsonl", EXAMPLES_FORMAT)[1]}
    path = run_dir / "ingest" / "traces.jsonl"
    head, refs = read_refs(path, EXAMPLES_FORMAT)
    return list(open_store(head, path).examples(r for r in refs if r["trace_id"] not in train))


def channel_contributions(metrics_rows: list[dict], weights: dict[str, float]) -> list[dict[str, Any]]:
    """Per channel of the offline phase: mean loss, weight, mean weighted term and its share of the total."""
    rows = []
    totals = [r["loss/total"] for r in metrics_rows if "loss/total" in r]
    total = statistics.fmean(totals) if totals else float("nan")
    for ch in ("lm_ce", "sdpo_jsd", "trace_replay_dpo"):
        vals = [r[f"loss/{ch}"] for r in metrics_rows if f"loss/{ch}" in r]
        if not vals:
            continue
        w = weights.get(ch, 1.0)
        term = w * statistics.fmean(vals)
        share = term / total if total and math.isfinite(total) else float("nan")
        rows.append({"channel": ch, "weight": w, "mean_loss": statistics.fmean(vals), "weighted": term,
                     "share_of_total": share, "first": vals[0], "last": vals[-1]})  # fmt: skip
    return rows


def verdict(s: dict[str, Any], lower_better: bool) -> str:
    """What a paired change (``paired``) says: better or worse when its 95% interval is clear of 0,
    within noise when the interval crosses 0."""
    lo, hi = s["delta_ci95"]
    if s["delta"] == 0 and lo == hi:
        return "no change"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"n={s['n']}: too few sites for an interval"
    if lo <= 0 <= hi:
        return "within noise (the 95% interval crosses 0)"
    better = hi < 0 if lower_better else lo > 0
    return f"{'better' if better else 'worse'} (the 95% interval is clear of 0)"


def headline(sites: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """(summary lines, names of headline metrics that got worse) for the report's first paragraph."""
    if not sites:
        return ["No held-out error sites: nothing to compare before and after."], []
    lines, fell = [], []
    for m, lower_better in HEADLINE.items():
        if m not in sites["metrics"]:
            continue
        s = sites["metrics"][m]
        worse = s["delta"] > 0 if lower_better else s["delta"] < 0
        lo, hi = s["delta_ci95"]
        arrow = "lower is better" if lower_better else "higher is better"
        lines.append(
            f"{m} ({arrow}): {s['before']:.4g} -> {s['after']:.4g} (change {s['delta']:+.3g}, "
            f"95% interval [{lo:+.3g}, {hi:+.3g}], n={s['n']} sites): {verdict(s, lower_better)}"
        )
        if worse:
            fell.append(m)
    return lines, fell


RECOVERY_SOURCE = "recorded recoveries (pairs.recovery)"  # the label of the teacher-free pairs


def count(n: Any, noun: str) -> str:
    """``"1 site"``, ``"30 sites"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def eval_rates(ev: dict[str, Any]) -> list[tuple[str, float, float, str]]:
    """The rates of the one evaluation, each with its n: ``(label, before, after, n)`` for the held-out
    sites' rates (``sites``) and the sandbox pass rate over its tasks."""
    out = []
    metrics = (ev.get("sites") or {}).get("metrics") or {}
    for m in HEADLINE:
        if m.endswith("_rate") and m in metrics:
            out.append((m, metrics[m]["before"], metrics[m]["after"], count(metrics[m]["n"], "site")))
    b, a = ev.get("before") or {}, ev.get("after") or {}
    if b.get("sandbox_pass_rate") is not None and a.get("sandbox_pass_rate") is not None:
        n = a.get("sandbox_scored", a.get("sandbox_tasks"))
        out.append(("sandbox_pass_rate", b["sandbox_pass_rate"], a["sandbox_pass_rate"], count(n, "task")))
    return out


# Why a channel's per-step loss can end above where it started although training works (one line each).
_CHANNEL_WHY = {
    "lm_ce": "each step scores another batch of sessions, so one step's CE mostly reflects its batch; the "
    "held-out recovery CE is the measure",
    "sdpo_jsd": "self-distillation compares the student with the hinted model, which trains with it (and, "
    "on-policy, on the student's fresh samples each step): not a fixed target; the held-out JSD to the "
    "hinted teacher is the measure",
    "trace_replay_dpo": "each step draws another batch of pairs, and the value (with RPO's NLL of the "
    "chosen response) mostly reflects which pairs it drew; the held-out rates are the measure",
}


def channel_readings(metrics_rows: list[dict]) -> list[str]:
    """One line per offline channel whose loss at the last step is above the first step's: the two
    values, the first and last quarter's means (the trend, less the batch noise) and why."""
    out = []
    for ch, why in _CHANNEL_WHY.items():
        vals = [float(r[f"loss/{ch}"]) for r in metrics_rows if f"loss/{ch}" in r]
        if len(vals) < 2 or vals[-1] <= vals[0]:
            continue
        q = max(1, len(vals) // 4)
        head, tail = statistics.fmean(vals[:q]), statistics.fmean(vals[-q:])
        trend = "rose" if tail > head else "fell"
        out.append(
            f"{ch} ends above where it started ({vals[0]:.3g} at the first step, {vals[-1]:.3g} at the last); "
            f"its mean over the last {q} step(s) is {tail:.3g} against {head:.3g} over the first {q}, so "
            f"the trend {trend}: {why}."
        )
    return out


def grpo_reading(rows: list[dict]) -> list[str]:
    """The GRPO phase in words: in how many steps every group's completions scored the same
    (``frac_reward_zero_std`` 1: the policy term has no gradient), and the mean reward's first and last."""
    zero = [float(r["frac_reward_zero_std"]) for r in rows if r.get("frac_reward_zero_std") is not None]
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    if not zero:
        return []
    n, dead = len(zero), sum(z >= 1.0 for z in zero)
    if dead == n:
        out = [
            f"In {'the one step' if n == 1 else f'all {n} steps'} of the GRPO phase every group's completions "
            "scored the same reward (frac_reward_zero_std 1.0): the policy term had no gradient, and only "
            "the SDPO and DPO terms changed the weights."
        ]
    elif dead:
        out = [
            f"In {dead} of {n} GRPO steps every group's completions scored the same reward "
            f"(frac_reward_zero_std 1.0: no policy gradient in those steps); in the other {n - dead} some "
            "group had reward variance, so the policy term had a gradient."
        ]
    else:
        out = [
            f"Every one of the {n} GRPO steps had groups with reward variance: the policy term had a gradient."
        ]
    if rewards:
        out.append(
            f"Mean reward {rewards[0]:.3g} at the first step, {rewards[-1]:.3g} at the last"
            + (" (one step: the plot shows points, not a curve)." if len(rewards) == 1 else ".")
        )
    return out
