"""The report renders in a real browser: every plot it references decodes."""

from __future__ import annotations

import json

import pytest

from composer_replication._io import write_jsonl_atomic
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.report import write_report

from ._chromium import chromium_available, images_loaded

pytestmark = pytest.mark.skipif(
    not chromium_available(), reason="chromium not installed (scripts/setup.sh installs it)"
)


def _fake_run(d):
    m = Manifest(d)
    for name in ("ingest", "replay", "train_offline"):
        rec = m.stage(name)
        rec.status, rec.summary = "done", {"n": 3}
    m.save()
    write_jsonl_atomic(
        d / "train" / "offline" / "metrics.jsonl",
        [
            {"step": s, "loss/total": 3.0 / s, "loss/lm_ce": 2.0 / s, "loss/sdpo_jsd": 0.5, "grad_norm": 1.0}
            for s in range(1, 5)
        ],
    )
    write_jsonl_atomic(
        d / "train" / "grpo" / "metrics.jsonl",
        [{"step": s, "loss": 0.1 * s, "reward": 0.25 * s, "reward_std": 0.1} for s in range(1, 3)],
    )
    write_jsonl_atomic(
        d / "replay" / "teacher_calls.jsonl",
        [
            {
                "state_id": f"t::{i}",
                "teacher_slug": t,
                "cost_usd": 0.001 * i,
                "response_text": "x",
                "error": None,
            }
            for i in range(3)
            for t in ("a/x", "b/y")
        ],
    )
    (d / "pairs").mkdir()
    (d / "pairs" / "per_teacher.json").write_text(json.dumps({"a/x": 2, "b/y": 1}))
    (d / "eval").mkdir()
    (d / "eval" / "eval.json").write_text(
        json.dumps(
            {
                "note": "n",
                "before": {
                    "valid_rate": 0.2,
                    "tool_match_rate": 0.0,
                    "exact_match_rate": 0.0,
                    "sandbox_pass_rate": 0.0,
                },
                "after": {
                    "valid_rate": 0.6,
                    "tool_match_rate": 0.2,
                    "exact_match_rate": 0.0,
                    "sandbox_pass_rate": 0.5,
                },
            }
        )
    )


def test_every_plot_loads_in_headless_chromium(tmp_path):
    _fake_run(tmp_path)
    html = write_report(tmp_path, title="t <script>")
    plots = sorted(p.name for p in html.parent.glob("*.png"))
    assert plots == [
        "eval.png",
        "losses_grpo.png",
        "losses_offline.png",
        "pairs_per_teacher.png",
        "reward.png",
        "spend.png",
    ]
    text = html.read_text()
    assert "t &lt;script&gt;" in text  # titles are escaped
    assert all(f'src="{p}"' in text for p in plots)  # relative paths: the folder is self-contained
    assert images_loaded(html) == (6, 6)
    # the check can fail: a plot that is missing on disk is counted as not loaded
    (html.parent / "reward.png").unlink()
    assert images_loaded(html) == (5, 6)


def test_report_of_an_empty_run_has_no_broken_images(tmp_path):
    Manifest(tmp_path).save()
    html = write_report(tmp_path)
    assert images_loaded(html) == (0, 0)
    assert "No teacher calls" in html.read_text()
