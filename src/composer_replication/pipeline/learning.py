"""Did the run teach? Before/after at held-out error sites with n and spread, and per-channel shares.

``site_comparison`` measures the student before training and the trained model on the error sites of the
held-out traces (``trainer.site_eval``: recovery CE, JSD to the hinted teacher, greedy valid-action and
tool-match rates) and summarises each metric as a paired comparison over sites: the mean before and
after, the mean per-site change, its standard deviation and a 95% t interval, with ``n`` sites.
``channel_contributions`` reads the offline phase's ``metrics.jsonl``: each channel's mean loss, its
weight, and its weighted share of the total loss. ``headline`` turns both into the lines the report
opens with, and names every headline metric that got worse.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

# metric -> True when lower is better
HEADLINE = {"recovery_ce": True, "hinted_jsd": True, "valid_rate": False, "tool_match_rate": False}
# two-sided 95% Student t quantiles for 1..30 degrees of freedom (beyond: the normal 1.96)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def paired(before: list[float], after: list[float]) -> dict[str, Any]:
    """Mean before/after and the per-site change with its spread and 95% interval."""
    if len(before) != len(after) or not before:
        raise ValueError(f"paired comparison needs equal, non-empty lists ({len(before)} vs {len(after)})")
    d = [a - b for a, b in zip(after, before, strict=True)]
    n = len(d)
    sd = statistics.stdev(d) if n > 1 else 0.0
    half = (_T95[n - 2] if n - 1 <= len(_T95) else 1.96) * sd / math.sqrt(n) if n > 1 else float("nan")
    mean = statistics.fmean(d)
    return {"before": statistics.fmean(before), "after": statistics.fmean(after), "delta": mean,
            "delta_std": sd, "delta_ci95": [mean - half, mean + half], "n": n}  # fmt: skip


def heldout_traces(run_dir: Path) -> list[dict]:
    """The ingested traces (``TraceExample`` rows) that the split kept out of training."""
    from composer_replication.ingestion.store import EXAMPLES_FORMAT, open_store, read_refs

    train = {t["trace_id"] for t in read_refs(run_dir / "split" / "train_traces.jsonl", EXAMPLES_FORMAT)[1]}
    path = run_dir / "ingest" / "traces.jsonl"
    head, refs = read_refs(path, EXAMPLES_FORMAT)
    return list(open_store(head, path).examples(r for r in refs if r["trace_id"] not in train))


def site_comparison(
    traces: list[dict],
    before_dir: Path,
    after_dir: Path,
    *,
    max_len: int,
    max_new_tokens: int,
    batch_size: int = 32,
) -> dict[str, Any] | None:
    """Paired before/after site metrics of two saved models (None when the traces hold no error site).
    ``batch_size`` sites decode together: a decoding step costs about the same for 2 rows as for 30
    (docs/benchmarks/learning.md, "Measuring cost"), so fewer, larger batches are faster."""
    from composer_replication.models import load_causal_lm, load_tokenizer
    from composer_replication.trainer.onpolicy import error_sites
    from composer_replication.trainer.site_eval import SiteSet

    sites = error_sites(traces, need_hint=False)
    if not sites:
        return None
    tok = load_tokenizer(after_dir)
    ss = SiteSet(tok, sites, max_len=max_len, max_new_tokens=max_new_tokens, batch_size=batch_size)
    per: dict[str, dict[str, list[float]]] = {}
    for phase, d in (("before", before_dir), ("after", after_dir)):
        model = load_causal_lm(d)
        per[phase] = ss.measure(model)["per_site"]
        del model
    return {
        "n_sites": len(ss),
        "metrics": {m: paired(per["before"][m], per["after"][m]) for m in HEADLINE if per["before"][m]},
        "per_site": per,
        "site_ids": [r.site.site_id for r in ss.rows],
    }


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
            f"95% interval [{lo:+.3g}, {hi:+.3g}], n={s['n']} sites)"
        )
        if worse:
            fell.append(m)
    return lines, fell
