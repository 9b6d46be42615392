"""Paired before/after comparisons: per-site (or per-task) changes with their spread and 95% interval.

``paired(before, after)`` summarises two equal lists of per-item values: the mean before and after, the
mean per-item change, its standard deviation and a 95% Student t interval, with ``n``.
``site_comparison`` measures two saved models (the student before training, the trained model) at the
error sites of held-out traces (``trainer.evaluation.sites``: recovery CE, JSD to the hinted teacher,
greedy valid-action and tool-match rates) and summarises each ``HEADLINE`` metric with ``paired``.
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
    from composer_replication.trainer.error_sites import error_sites
    from composer_replication.trainer.evaluation.sites import SiteSet

    sites = error_sites(traces, need_hint=False)
    if not sites:
        return None
    tok = load_tokenizer(after_dir)
    ss = SiteSet(tok, sites, max_len=max_len, max_new_tokens=max_new_tokens, batch_size=batch_size)
    per: dict[str, dict[str, list[float]]] = {}
    answers: dict[str, list[str]] = {}
    for phase, d in (("before", before_dir), ("after", after_dir)):
        model = load_causal_lm(d)
        measured = ss.measure(model)
        per[phase], answers[phase] = measured["per_site"], measured["answers"]
        del model
    return {
        "n_sites": len(ss),
        "metrics": {m: paired(per["before"][m], per["after"][m]) for m in HEADLINE if per["before"][m]},
        "per_site": per,
        "site_ids": [r.site.site_id for r in ss.rows],
        "answers": answers,  # the greedy answers the valid and tool-match rates score, in site order
    }
