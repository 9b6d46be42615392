"""What the report says: one evaluation with every rate's n, "within noise" where an interval crosses 0,
the recovery pairs DPO trained on, no $0 spend line, a GRPO phase without policy gradient said in
words, and a reading for a loss that ends above its start (the page is also rendered in Chromium)."""

from __future__ import annotations

import json
import re

import pytest

from composer_replication._io import write_jsonl_atomic
from composer_replication.pipeline.learning import (
    RECOVERY_SOURCE,
    channel_readings,
    eval_rates,
    grpo_reading,
    verdict,
)
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.report import collect, write_report
from composer_replication.trainer.evaluation.paired import paired

from ._chromium import chromium_available, images_loaded
from ._report_run import eval_json, fake_run


def _section(page: str, heading: str) -> str:
    start = page.index(f"<h2>{heading}</h2>")
    nxt = page.find("<h2>", start + 1)
    return page[start : nxt if nxt > 0 else None]


def _table_rows(html_part: str) -> list[list[str]]:
    body = html_part[html_part.index("<tbody>") : html_part.index("</tbody>")]
    return [re.findall(r"<td>(.*?)</td>", row) for row in body.split("<tr>")[1:]]


def test_one_evaluation_every_rate_with_its_n(tmp_path):
    fake_run(tmp_path)
    page = write_report(tmp_path).read_text()
    ev = _section(page, "Evaluation")
    rows = {r[0]: r for r in _table_rows(ev)}
    # the held-out comparison (4 sites) and the sandbox tasks (2): one row per metric, each with its n
    assert list(rows) == ["recovery_ce", "valid_rate", "tool_match_rate", "sandbox_pass_rate"]
    assert [rows[m][5] for m in rows] == ["4 sites", "4 sites", "4 sites", "2 tasks"]
    assert rows["valid_rate"][1:3] == ["0.25", "0.5"] and rows["sandbox_pass_rate"][1:3] == ["0", "0.5"]
    # the greedy block's 1-site rate (valid 0.0 -> 0.0) is not a second set of numbers: only its answers show
    assert "0.000" not in ev and "Sample answers" in ev and "[TOOL_USE] name=Bash" in ev
    assert "they are examples, not the measurement" in ev
    labels = [
        f"{m} (n={n})" for m, _, _, n in eval_rates(json.loads((tmp_path / "eval" / "eval.json").read_text()))
    ]
    assert labels == [
        "valid_rate (n=4 sites)",
        "tool_match_rate (n=4 sites)",
        "sandbox_pass_rate (n=2 tasks)",
    ]


def test_without_a_greedy_block_the_samples_are_answers_the_table_scored(tmp_path):
    """``evaluate.max_sites: 0`` (the demo): the sample answers come from the site comparison itself."""
    fake_run(tmp_path)
    ev = eval_json()
    for phase in ("before", "after"):
        ev[phase].update(n_sites=0, valid_rate=None, sites=[])
    (tmp_path / "eval" / "eval.json").write_text(json.dumps(ev))
    samples = _section(write_report(tmp_path).read_text(), "Evaluation").split("<h3>Sample answers</h3>")[1]
    assert "Greedy answers at 3 of the 4 held-out error sites the table scores" in samples
    rows = _table_rows(samples)
    assert rows[0] == ["t::s0", "not valid: loops loops loops", "valid: [TOOL_USE] name=Bash input={}"]
    assert [r[0] for r in rows] == ["t::s0", "t::s1", "t::s2"]


def test_changes_whose_interval_crosses_zero_are_called_within_noise(tmp_path):
    fake_run(tmp_path)
    page = write_report(tmp_path).read_text()
    rows = {r[0]: r for r in _table_rows(_section(page, "Evaluation"))}
    assert rows["recovery_ce"][6] == "better (the 95% interval is clear of 0)"
    assert rows["valid_rate"][6] == rows["tool_match_rate"][6] == "within noise (the 95% interval crosses 0)"
    opening = _section(page, "What training did, on held-out sessions")
    assert "Within noise: valid_rate, tool_match_rate: the 95% interval of the change crosses 0" in opening
    assert "recovery_ce (lower is better): 2.4 -&gt; 2.125" in opening and "n=4 sites): better" in opening


@pytest.mark.parametrize(
    "before, after, lower_better, words",
    [
        ([2.0, 2.1, 2.2], [1.5, 1.6, 1.6], True, "better"),
        ([2.0, 2.1, 2.2], [2.5, 2.6, 2.6], True, "worse"),
        ([0.0, 1.0, 0.0], [1.0, 1.0, 0.0], False, "within noise"),
        ([0.0, 1.0, 1.0], [0.0, 0.0, 0.0], False, "within noise"),  # a drop that 3 sites cannot tell from 0
        ([0.5, 0.5], [0.5, 0.5], False, "no change"),
        ([1.0], [2.0], True, "n=1: too few sites"),
    ],
)
def test_verdict(before, after, lower_better, words):
    assert verdict(paired(before, after), lower_better).startswith(words)


def _manifest_with_pairs(d, *, teacher_pairs: int, recovery: int, kept: int) -> None:
    m = Manifest(d)
    for name, summary in (("pairs", {"states": 2, "pairs": teacher_pairs, "recovery_pairs": recovery}),
                          ("normalize", {"pairs_in": teacher_pairs + recovery, "pairs_out": kept})):  # fmt: skip
        rec = m.stage(name)
        rec.status, rec.summary = "done", summary
    m.save()


def test_the_pairs_chart_counts_the_recovery_pairs_dpo_trained_on(tmp_path):
    fake_run(tmp_path, cost_usd=0.0)
    _manifest_with_pairs(tmp_path, teacher_pairs=0, recovery=33, kept=33)
    (tmp_path / "pairs" / "per_teacher.json").write_text(json.dumps({"a/x": 0, "b/y": 0}))
    d = collect(tmp_path)
    assert d["pair_sources"] == {
        "teacher consensus: a/x": 0,
        "teacher consensus: b/y": 0,
        RECOVERY_SOURCE: 33,
    }
    page = write_report(tmp_path).read_text()
    assert (tmp_path / "report" / "pairs_per_teacher.png").is_file()
    text = _section(page, "Preference pairs")
    assert "0 from teacher consensus; 33 recorded recoveries from the training sessions" in text
    assert "the preference channel (DPO) trained on 33" in text
    assert "recorded recoveries (pairs.recovery)" in page.split("<h2>Plots</h2>")[1]  # the chart's caption


def test_an_offline_run_says_no_paid_teachers_instead_of_a_flat_spend_line(tmp_path):
    fake_run(tmp_path, cost_usd=0.0)
    page = write_report(tmp_path).read_text()
    assert not (tmp_path / "report" / "spend.png").exists()
    assert "No paid teachers in this run: its 6 teacher calls cost $0" in _section(page, "Teacher spend")
    fake_run(tmp_path / "paid", cost_usd=0.001)
    page = write_report(tmp_path / "paid").read_text()
    assert (tmp_path / "paid" / "report" / "spend.png").is_file() and "No paid teachers" not in page


def test_a_grpo_phase_without_reward_variance_is_said_in_words(tmp_path):
    fake_run(tmp_path)
    rows = [{"step": s, "reward": 0.233, "frac_reward_zero_std": 1.0, "loss": 0.0} for s in (1, 2, 3)]
    write_jsonl_atomic(tmp_path / "train" / "grpo" / "metrics.jsonl", rows)
    text = _section(write_report(tmp_path).read_text(), "GRPO phase")
    assert "In all 3 steps of the GRPO phase every group&#x27;s completions scored the same reward" in text
    assert "the policy term had no gradient" in text
    one = grpo_reading(rows[:1])
    assert "the one step" in one[0] and "one step: the plot shows points, not a curve" in one[1]
    mixed = grpo_reading([{**rows[0], "frac_reward_zero_std": 0.5}, *rows[1:]])
    assert mixed[0].startswith("In 2 of 3 GRPO steps") and "the policy term had a gradient" in mixed[0]
    assert grpo_reading([{**r, "frac_reward_zero_std": 0.0} for r in rows])[0].startswith(
        "Every one of the 3"
    )
    assert grpo_reading([{"step": 1, "loss": 0.1}]) == []


def test_a_channel_whose_loss_ends_above_its_start_gets_a_reading(tmp_path):
    rows = [{"step": s, "loss/total": 3.0 - 0.1 * s, "loss/lm_ce": 3.0 - 0.1 * s,
             "loss/sdpo_jsd": [0.033, 0.02, 0.03, 0.04, 0.045, 0.052][s - 1],
             "loss/trace_replay_dpo": [3.6, 3.0, 2.5, 2.8, 2.2, 2.0][s - 1]} for s in range(1, 7)]  # fmt: skip
    lines = channel_readings(rows)
    assert len(lines) == 1 and lines[0].startswith("sdpo_jsd ends above where it started (0.033 at the first")
    assert (
        "its mean over the last 1 step(s) is 0.052 against 0.033 over the first 1, so the trend rose"
        in lines[0]
    )
    fake_run(tmp_path)
    write_jsonl_atomic(tmp_path / "train" / "offline" / "metrics.jsonl", rows)
    page = write_report(tmp_path).read_text()
    assert "sdpo_jsd ends above where it started" in page and "trace_replay_dpo ends above" not in page


@pytest.mark.skipif(not chromium_available(), reason="chromium not installed (scripts/setup.sh installs it)")
def test_the_offline_run_report_renders(tmp_path):
    fake_run(tmp_path, cost_usd=0.0)
    _manifest_with_pairs(tmp_path, teacher_pairs=0, recovery=33, kept=33)
    (tmp_path / "eval" / "eval.json").write_text(json.dumps(eval_json(valid_after=[0.0, 0.0, 0.0, 0.0])))
    html = write_report(tmp_path)
    pngs = sorted(p.name for p in html.parent.glob("*.png"))
    assert pngs == [
        "eval.png",
        "losses_grpo.png",
        "losses_offline.png",
        "pairs_per_teacher.png",
        "reward.png",
    ]
    assert images_loaded(html) == (5, 5)
