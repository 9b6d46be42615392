"""The one wire format: the same state reaches the model as the same tokens in training, GRPO and
evaluation; the format's pieces round-trip; no other module spells them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from composer_replication import wire

SESSIONS = Path(__file__).parent / "data" / "sessions"
SRC = Path(__file__).parents[1] / "src" / "composer_replication"


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    """Every bundled session (Claude Code and Codex), error-site examples reaching back to the segment
    start (so an example's turns are exactly the history of the state at its recovery)."""
    from composer_replication.ingestion import ingest_paths

    out = tmp_path_factory.mktemp("wire-ingest")
    ingest_paths([SESSIONS], out, example_max_tokens=10**9)
    from composer_replication.ingestion import read_examples, read_states  # the ingest folder's reader

    states = list(read_states(out / "states.jsonl"))
    traces = list(read_examples(out / "traces.jsonl"))
    return states, traces


def _tokenizer(name: str):
    from composer_replication import models

    if name == "tiny":
        return models.build_tiny_tokenizer(2048)
    if name == "qwen":
        return models.build_qwen_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.resolve_default_model())


@pytest.mark.parametrize("tok_name", ["tiny", "qwen", "smollm2"])
def test_same_state_same_prompt_ids_in_training_grpo_and_evaluation(ingested, tok_name):
    from composer_replication.pipeline.evaluate import is_error_site, prompt_ids
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    from composer_replication.trainer.grpo_run import build_rows, fit_prompt

    states, traces = ingested
    tok = _tokenizer(tok_name)
    sites = {t["turns"][-1]["state_id"]: t for t in traces if t["kind"] == "error_site"}
    rows = {r["state_id"]: r for r in build_rows(traces, [])}
    collator = ComposerDataCollator(tok, CollatorConfig(max_seq_len=10**6, hint_generator=None))
    checked = {"claude_code": 0, "codex": 0}
    for state in states:
        if not is_error_site(state) or state["state_id"] not in sites:
            continue
        if checked[state["source"]] >= 2:  # the longest histories take a while per tokenizer
            continue
        # evaluation: the prompt GreedyGenerator feeds the model
        ev = prompt_ids(tok, state, 10**6)[0].tolist()
        # GRPO: the row's prompt as TRL renders it (GRPOTrainer._tokenize_prompts)
        prompt = fit_prompt(tok, rows[state["state_id"]]["prompt"], 10**6)
        grpo = tok.apply_chat_template(
            conversation=[prompt], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
        # training: the collator's row for the trace whose last turn is this state's recovery
        out = collator([sites[state["state_id"]]])
        ids, resp = out["input_ids"][0].tolist(), out["response_mask"][0].tolist()
        n = len(ev)
        assert list(grpo) == ev, state["state_id"]
        assert ids[:n] == ev, state["state_id"]
        # ... and the next tokens are the recorded recovery, the training target
        assert resp[n - 1] == 0 and resp[n] == 1
        recovery = sites[state["state_id"]]["turns"][-1]["content"]
        assert tok.decode(ids[n:]).startswith(recovery)
        assert wire.canonical_action(recovery) == wire.canonical_action(state["student_action"])
        checked[state["source"]] += 1
    assert checked == {"claude_code": 2, "codex": 2}


def test_teacher_prompt_is_the_state_conversation_plus_review_instructions(ingested):
    from composer_replication.teacher_replay.prompt import TEACHER_INSTRUCTIONS, build_messages

    state = ingested[0][5]
    msgs = build_messages(state)
    assert msgs[1:] == state["messages"][1:]
    assert msgs[0]["content"] == state["messages"][0]["content"] + "\n\n" + TEACHER_INSTRUCTIONS
    assert wire.ACTION_FORMAT in msgs[0]["content"]


def test_states_render_traces_turn_for_turn(ingested):
    states, traces = ingested
    by_id = {s["state_id"]: s for s in states}
    n = 0
    for tr in traces:
        for j, turn in enumerate(tr["turns"]):
            sid = turn.get("state_id") if turn["role"] == "assistant" else None
            if sid in by_id and tr["turns"][0]["role"] == "user" and tr["kind"] == "error_site":
                assert wire.trace_messages(tr, j)[0] == by_id[sid]["messages"]
                n += 1
    assert n >= 10


def test_action_round_trip_and_malformed_lines():
    line = wire.format_tool_use("Write", {"file_path": "a.py", "content": "x = 1\nprint(x)\n"})
    assert "\n" not in line and line.startswith("[TOOL_USE] name=Write input=")
    text = (
        "I'll write it.\n\n" + line + "\n\n[TOOL_USE] name=Bash input={oops\n[THINKING] hmm\nstill thinking"
    )
    parsed = wire.parse_action(text)
    assert parsed.text == "I'll write it." and not parsed.ok
    assert parsed.tool_calls == (("Write", {"file_path": "a.py", "content": "x = 1\nprint(x)\n"}),)
    calls = wire.tool_calls(text)
    assert (
        calls[0]["name"] == "Write"
        and calls[1]["name"] == "_invalid"
        and "Bash" in calls[1]["input"]["error"]
    )
    assert wire.tool_calls('[TOOL_USE] name=Bash input=["ls"]')[0]["name"] == "_invalid"
    canon = wire.canonical_action(line)
    assert wire.canonical_action(wire.render_canonical(canon)) == canon


def test_tool_result_hint_and_merging():
    res = wire.format_tool_result("Edit", "old_string not found", True)
    assert wire.parse_tool_result_head(res) == ("Edit", True)
    assert wire.parse_tool_result_head("plain text") is None
    turns = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": wire.format_tool_use("Edit", {"file_path": "a"})},
        {"role": "tool", "name": "Edit", "content": "boom", "tool_error": "boom"},
        {"role": "user", "content": "also this"},
        {"role": "assistant", "content": ""},
    ]
    msgs, where = wire.turns_to_messages(turns, "sys")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant"]
    assert where == [1, 2, 3, 3, 4]
    assert msgs[3]["content"] == "[TOOL_RESULT name=Edit is_error=true]\nboom\n\nalso this"
    before = [dict(m) for m in msgs]
    hinted = wire.add_hint(msgs[:4], "read the file first")
    assert msgs == before  # no mutation
    assert hinted[3]["content"].endswith("also this\n\n[HINT] read the file first")
    # merging a turn replaces the message object: a list holding the old one is not changed
    shared = msgs[:4]
    wire.append_turn(msgs := msgs[:4], {"role": "tool", "name": "Bash", "content": "ok", "tool_error": None})
    assert shared[3]["content"].endswith("also this") and msgs[3]["content"].endswith("\nok")


def test_system_text_names_and_schemas():
    from composer_replication.datagen.tools import TOOL_SCHEMAS

    assert wire.system_text().startswith(
        "You are a senior software engineer working as a coding agent in a terminal environment"
    )
    assert wire.system_text(["Bash", "Read"]).endswith("\nAvailable tools: Bash, Read.")
    text = wire.system_text(TOOL_SCHEMAS)
    assert '- Edit input={"file_path": "the path of the file", "old_string"' in text
    assert wire.system_text(["Bash"], base="custom") == "custom\nAvailable tools: Bash."
    tr = {"turns": [{"role": "assistant", "content": "x", "tool_calls": [{"name": "Grep"}]}]}
    assert wire.trace_tools(tr) == ["Grep"] and wire.trace_tools({**tr, "tools": ["A"]}) == ["A"]


def test_fit_messages_keeps_everything_that_fits_and_the_system_message(tiny_tokenizer):
    msgs = [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20} for i in range(9)
    ]
    assert wire.fit_messages(tiny_tokenizer, msgs, 10**6) == msgs
    fitted = wire.fit_messages(tiny_tokenizer, msgs, 200)
    assert fitted[0] == msgs[0] and fitted[-1] == msgs[-1] and len(fitted) < len(msgs)
    ids = tiny_tokenizer.apply_chat_template(fitted, add_generation_prompt=True, tokenize=True)
    assert len(ids if isinstance(ids, list) else ids["input_ids"]) <= 200


def test_task_prompt_is_the_grpo_row_prompt():
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tasks import bundled_tasks
    from composer_replication.pipeline.grpo_phase import task_rows

    tasks, rows = task_rows([])
    for row in rows:
        task = tasks[row["task"]]
        assert row["prompt"] == task_prompt(task)
        assert row["prompt"][0]["content"].startswith(wire.SYSTEM_PROMPT)
        assert task.instruction in row["prompt"][1]["content"]
    assert set(tasks) == set(bundled_tasks())


def test_no_module_but_wire_spells_the_format():
    """The format's markers live in ``wire`` only (docstrings may name them)."""
    pattern = re.compile(
        r"""["'](\[TOOL_USE\]|\[TOOL_RESULT|\[HINT\]|\[THINKING\]|<tool_call>)"""  # a literal starting with one
        r"|\[TOOL_USE\] name=\{|\[TOOL_RESULT name=\{|\[HINT\] \{|<tool_call>\s*\{"  # an f-string building one
    )
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "wire.py":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{no}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
