"""Before/after at held-out sites with n and spread, channel shares, and the report's opening warning."""

from __future__ import annotations

import json
import statistics

import pytest

from composer_replication._io import write_jsonl_atomic
from composer_replication.pipeline.learning import channel_contributions, headline
from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.report import write_report
from composer_replication.trainer.evaluation.paired import paired


def test_paired_change_interval_by_hand():
    before, after = [2.0, 3.0, 4.0, 5.0], [1.5, 2.0, 4.0, 4.1]
    s = paired(before, after)
    d = [-0.5, -1.0, 0.0, -0.9]
    half = 3.182 * statistics.stdev(d) / 2  # t(0.975, 3) * sd / sqrt(4)
    assert s["n"] == 4 and s["before"] == 3.5 and s["after"] == pytest.approx(2.9)
    assert s["delta"] == pytest.approx(-0.6) and s["delta_std"] == pytest.approx(statistics.stdev(d))
    assert s["delta_ci95"] == pytest.approx([-0.6 - half, -0.6 + half])
    with pytest.raises(ValueError, match="equal, non-empty"):
        paired([1.0], [])


def _sites(ce_after: float, valid_after: float) -> dict:
    per = {"before": {"recovery_ce": [2.0, 2.2], "hinted_jsd": [0.05, 0.07], "valid_rate": [0.0, 1.0],
                      "tool_match_rate": [0.0, 0.0]},
           "after": {"recovery_ce": [ce_after, ce_after], "hinted_jsd": [0.04, 0.05],
                     "valid_rate": [valid_after, 1.0], "tool_match_rate": [0.0, 1.0]}}  # fmt: skip
    return {"n_sites": 2, "metrics": {m: paired(per["before"][m], per["after"][m]) for m in per["before"]}}


def test_headline_names_what_got_worse():
    lines, fell = headline(_sites(ce_after=1.9, valid_after=1.0))
    assert fell == [] and len(lines) == 4 and "n=2 sites" in lines[0]
    _, fell = headline(_sites(ce_after=2.5, valid_after=0.0))
    assert fell == ["recovery_ce"]  # valid_rate stays 0.5 -> 0.5: not worse
    _, fell = headline(_sites(ce_after=2.5, valid_after=-1.0))
    assert fell == ["recovery_ce", "valid_rate"]


def test_channel_contributions_are_weighted_shares():
    rows = [{"loss/total": 3.0, "loss/lm_ce": 2.0, "loss/sdpo_jsd": 0.5, "loss/trace_replay_dpo": 0.5},
            {"loss/total": 2.0, "loss/lm_ce": 1.0, "loss/sdpo_jsd": 0.5, "loss/trace_replay_dpo": 0.5}]  # fmt: skip
    c = {r["channel"]: r for r in channel_contributions(rows, {"sdpo_jsd": 1.0, "trace_replay_dpo": 1.0})}
    assert c["lm_ce"]["mean_loss"] == 1.5 and c["lm_ce"]["share_of_total"] == pytest.approx(0.6)
    assert c["sdpo_jsd"]["weighted"] == 0.5 and c["trace_replay_dpo"]["last"] == 0.5


def _run(d, sites):
    m = Manifest(d)
    m.data["config"] = {"train": {"loss": {"sdpo": {"weight": 2.0}, "preference": {"weight": 0.1}}}}
    m.save()
    write_jsonl_atomic(
        d / "train" / "offline" / "metrics.jsonl",
        [
            {
                "step": 1,
                "loss/total": 3.0,
                "loss/lm_ce": 2.0,
                "loss/sdpo_jsd": 0.5,
                "loss/trace_replay_dpo": 0.0,
            }
        ],
    )
    (d / "eval").mkdir()
    (d / "eval" / "eval.json").write_text(json.dumps({"before": {}, "after": {}, "sites": sites}))


def test_report_opens_with_the_warning_when_a_headline_metric_falls(tmp_path):
    _run(tmp_path, _sites(ce_after=2.5, valid_after=1.0))
    page = write_report(tmp_path).read_text()
    warn = page.index("Training made these held-out metrics worse: recovery_ce")
    assert warn < page.index("<h2>Stages</h2>")
    assert "n=2 sites" in page and "share of total" in page
    assert "<td>sdpo_jsd</td><td>2</td><td>0.5</td><td>1</td><td>33.3%</td>" in page


def test_report_says_nothing_fell_when_nothing_fell(tmp_path):
    _run(tmp_path, _sites(ce_after=1.9, valid_after=1.0))
    page = write_report(tmp_path).read_text()
    assert "worse" not in page.split("<h2>Stages</h2>")[0].replace("No headline metric got worse", "")
    assert "No headline metric got worse on the held-out error sites." in page
