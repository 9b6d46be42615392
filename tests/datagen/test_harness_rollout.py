"""Rollouts in the session's own harness: a scripted policy through the Claude Code and the Codex harness on
a bundled task, the written log read back by the project's ingestion (the ``ingest`` CLI and the
ingesters), turns, tool calls, results and error flags compared with what ran; the oracle in every
harness; the limits on turns, tokens and wall time, each ending the rollout with its reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from composer_replication import wire
from composer_replication.datagen.harness import harness_schemas
from composer_replication.datagen.rollout import ScriptedPolicy, oracle_policy, run_rollout, task_prompt
from composer_replication.datagen.tasks import bundled_tasks
from composer_replication.datagen.tools import format_tool_call as call
from composer_replication.ingestion.claude_code import ClaudeCodeIngester
from composer_replication.ingestion.codex import CodexIngester

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

TASK = bundled_tasks()["off_by_one"]
FIX = ("    return sum(range(1, n))", "    return sum(range(1, n + 1))")

CLAUDE_STEPS = [
    ("Let me look.", "Glob", {"pattern": "**/*.py"}),
    ("", "Grep", {"pattern": "range", "output_mode": "content"}),
    (
        "",
        "Edit",
        {"file_path": "/workspace/mathx.py", "old_string": FIX[0], "new_string": FIX[1]},
    ),  # not read
    ("", "Read", {"file_path": "/workspace/mathx.py"}),
    ("", "Edit", {"file_path": "/workspace/mathx.py", "old_string": "nope", "new_string": "x"}),
    ("", "Edit", {"file_path": "/workspace/mathx.py", "old_string": FIX[0], "new_string": FIX[1]}),
    (
        "",
        "TodoWrite",
        {"todos": [{"content": "run tests", "status": "in_progress", "activeForm": "Testing"}]},
    ),
    ("", "Bash", {"command": TASK.test_command}),
]
CLAUDE_ERRORS = [False, False, True, False, True, False, False, False]
CODEX_STEPS = [
    ("Let me look.", "shell", {"command": ["bash", "-lc", "cat mathx.py"], "workdir": "/workspace"}),
    (
        "",
        "apply_patch",
        {"input": "*** Begin Patch\n*** Update File: mathx.py\n@@\n-nope\n+x\n*** End Patch"},
    ),
    (
        "",
        "apply_patch",
        {"input": f"*** Begin Patch\n*** Update File: mathx.py\n@@\n-{FIX[0]}\n+{FIX[1]}\n*** End Patch"},
    ),
    ("", "update_plan", {"plan": [{"step": "fix the range", "status": "completed"}]}),
    ("", "shell", {"command": ["bash", "-lc", "python3 -c 'import sys; sys.exit(4)'"]}),
    ("", "shell", {"command": ["bash", "-lc", TASK.test_command]}),
]
CODEX_ERRORS = [False, True, False, False, True, False]


def _script(steps):
    return ScriptedPolicy(
        [(f"{prose}\n" if prose else "") + call(n, a) for prose, n, a in steps] + ["Fixed."]
    )


def _ingest_cli(paths, out: Path) -> list[dict]:
    from composer_replication.cli.main import main

    assert main(["ingest", *map(str, paths), "--out", str(out), "--no-progress"]) == 0
    return [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("harness", "steps", "errors", "ingester"),
    [
        ("claude_code", CLAUDE_STEPS, CLAUDE_ERRORS, ClaudeCodeIngester),
        ("codex", CODEX_STEPS, CODEX_ERRORS, CodexIngester),
    ],
)
def test_rollout_log_round_trips_through_ingestion(tmp_path, harness, steps, errors, ingester):
    r = run_rollout(
        TASK,
        _script(steps),
        rollout_id=f"rt-{harness}",
        log_dir=tmp_path / "logs",
        harness=harness,
        max_turns=12,
    )
    assert (r.status, r.reward, r.turns, r.end_reason, r.harness) == (
        "ok",
        1.0,
        len(steps) + 1,
        "done",
        harness,
    )
    # the ingest CLI detects the format and counts what ran
    (row,) = _ingest_cli([r.session_log], tmp_path / "ingested")
    assert (row["source"], row["trace_id"], row["n_turns"]) == (harness, f"rt-{harness}", len(steps) + 1)
    assert (row["n_tool_calls"], row["n_tool_errors"]) == (len(steps), sum(errors))
    # the ingester's states: one per model turn, the action re-rendered, each result with its error flag
    states = list(ingester().ingest(Path(r.session_log)))
    assert [s["state_id"] for s in states] == [f"rt-{harness}::{i:04d}" for i in range(len(steps) + 1)]
    assert sorted(states[0]["tools"]) == sorted({name for _, name, _ in steps})  # the tools the session used
    for i, (prose, name, args) in enumerate(steps):
        action = wire.parse_action(states[i]["student_action"])
        assert action.text == prose
        assert [(c["name"], c["input"]) for c in wire.tool_calls(states[i]["student_action"])] == [
            (name, args)
        ]
        result = states[i + 1]["messages"][-1]  # a tool message (native tool calls), its error flag kept
        assert (result["role"], result["name"], bool(result["is_error"])) == ("tool", name, errors[i]), result
        assert (states[i + 1].get("error_kind") is not None) == errors[i]
    assert states[-1]["student_action"] == "Fixed."
    first = states[0]["messages"]
    assert TASK.instruction in first[-1]["content"] and first[0]["role"] == "system"


def test_error_kinds_survive_the_round_trip(tmp_path):
    claude = run_rollout(
        TASK, _script(CLAUDE_STEPS), rollout_id="ek-c", log_dir=tmp_path, harness="claude_code", max_turns=12
    )
    codex = run_rollout(TASK, _script(CODEX_STEPS), rollout_id="ek-x", log_dir=tmp_path, harness="codex")
    kinds = {
        h: [s.get("error_kind") for s in ing().ingest(Path(r.session_log)) if s.get("error_kind")]
        for h, r, ing in (("claude", claude, ClaudeCodeIngester), ("codex", codex, CodexIngester))
    }
    assert kinds == {
        "claude": ["file_not_read", "edit_mismatch"],
        "codex": ["edit_mismatch", "runtime_error"],
    }


@pytest.mark.parametrize("harness", [None, "claude_code", "codex"])
def test_oracle_scores_one_in_every_harness(tmp_path, harness):
    task = bundled_tasks()["fix_import"]
    r = run_rollout(task, oracle_policy(task, harness), log_dir=tmp_path, harness=harness)
    assert (r.status, r.reward, r.end_reason) == ("ok", 1.0, "done"), r.test_output


def test_the_prompt_lists_the_harness_tools(tiny_tokenizer):
    """The tools reach the model through the chat template's ``tools=`` (native tool calls)."""
    claude, codex, default = (
        wire.render(tiny_tokenizer, task_prompt(TASK, h), harness_schemas(h))
        for h in ("claude_code", "codex", None)
    )
    for tool in ("Bash", "Read", "Write", "Edit", "MultiEdit", "Grep", "Glob", "LS", "TodoWrite"):
        assert tool in claude
    assert all(t in codex for t in ("shell", "apply_patch", "update_plan"))
    assert "MultiEdit" not in codex and "TodoWrite" not in codex
    assert all(t in default for t in ("Bash", "Read", "Write", "Edit")) and "Grep" not in default


class Chatty:
    """Always calls a tool; reports its own token use."""

    model = "chatty"

    def __init__(self, action: str, tokens: int = 10) -> None:
        self.action, self.last_usage = action, {"output_tokens": tokens}

    def __call__(self, messages):
        return self.action


@pytest.mark.parametrize("harness", ["claude_code", "codex"])
def test_limits_end_the_rollout_with_their_reason(tmp_path, harness):
    ls = call("Bash", {"command": "ls"}) if harness != "codex" else call("shell", {"command": ["ls"]})
    r = run_rollout(TASK, Chatty(ls), rollout_id="turns", log_dir=tmp_path, harness=harness, max_turns=3)
    assert (r.turns, r.end_reason, r.tokens, r.reward) == (3, "max_turns", 30, 0.0)
    r = run_rollout(
        TASK, Chatty(ls, 25), rollout_id="tokens", log_dir=tmp_path, harness=harness, max_tokens=60
    )
    assert (r.turns, r.end_reason, r.tokens) == (3, "max_tokens", 75)
    sleep = (
        call("Bash", {"command": "sleep 30"})
        if harness != "codex"
        else call("shell", {"command": ["sleep", "30"], "timeout_ms": 60000})
    )
    r = run_rollout(TASK, Chatty(sleep), rollout_id="wall", log_dir=tmp_path, harness=harness, max_wall_s=1.5)
    assert (r.turns, r.end_reason) == (1, "max_wall_s") and r.duration_s < 15
    lines = [json.loads(x) for x in Path(r.session_log).read_text().splitlines()]
    if harness == "codex":
        assert lines[-1]["payload"] == {"type": "turn_aborted", "reason": "max_wall_s"}
    else:
        assert (lines[-1]["subtype"], lines[-1]["content"]) == ("rollout_end", "Rollout ended: max_wall_s")
    ingester = CodexIngester if harness == "codex" else ClaudeCodeIngester
    assert len(list(ingester().ingest(Path(r.session_log)))) == 1


def test_bad_harness_and_limits_are_one_line_errors():
    with pytest.raises(ValueError, match=r"unknown harness 'cursor'; expected one of claude_code, codex"):
        run_rollout(TASK, ScriptedPolicy([]), harness="cursor")
    with pytest.raises(ValueError, match="max_tokens must be a positive number, got 0"):
        run_rollout(TASK, ScriptedPolicy([]), max_tokens=0)
