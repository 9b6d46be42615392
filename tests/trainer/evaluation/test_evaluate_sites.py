"""``trainer.evaluation.greedy.evaluate_sites``: an answer cut by the token budget is not a valid action."""

from __future__ import annotations

from composer_replication.trainer.evaluation.greedy import evaluate_sites
from composer_replication.wire import format_tool_use

CALL = format_tool_use("Bash", {"command": "ls"})
STATE = {"state_id": "s", "messages": [], "student_action": CALL, "tools": ["Bash"]}


def test_complete_answers_score_as_before_and_cut_ones_are_invalid():
    answers = {"a": (CALL, True), "b": (CALL, False), "c": ("I looked at it. " * 30, False), "d": CALL}
    sites = [{**STATE, "state_id": k} for k in answers]
    res = evaluate_sites(lambda st: answers[st["state_id"]], sites)
    rows = {r["state_id"]: r for r in res["sites"]}
    assert rows["a"]["valid"] and rows["a"]["tool_match"] and rows["a"]["exact"]
    assert rows["d"]["valid"] and rows["d"]["complete"]  # a plain string: the generator does not know
    for k in ("b", "c"):  # cut by the budget: parses (well_formed) but no action
        assert rows[k]["well_formed"] and not rows[k]["valid"] and not rows[k]["tool_match"]
        assert not rows[k]["has_tool_call"]
    assert res["valid_rate"] == 0.5 and res["tool_match_rate"] == 0.5
