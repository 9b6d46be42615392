"""The one wire format: the same state reaches the model as the same tokens in training, GRPO and
evaluation; the format's pieces round-trip; no other module spells them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from composer_replication import wire

SESSIONS = Path(__file__).parents[1] / "data" / "sessions"
SRC = Path(__file__).parents[2] / "src" / "composer_replication"


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


@pytest.mark.parametrize(
    ("tok_name", "fmt"), [("tiny", "native"), ("qwen", "native"), ("smollm2", "native"), ("tiny", "text")]
)
def test_same_state_same_prompt_ids_in_training_grpo_and_evaluation(ingested, tok_name, fmt):
    with wire.use_format(fmt):
        _same_ids(ingested, tok_name, fmt)


def _same_ids(ingested, tok_name, fmt):
    from composer_replication import encoding
    from composer_replication.trainer.data_collator import CollatorConfig, ComposerDataCollator
    from composer_replication.trainer.evaluation.greedy import is_error_site, prompt_ids
    from composer_replication.trainer.grpo.build import dataset_rows
    from composer_replication.trainer.grpo.run import build_rows, fit_prompt

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
        # GRPO: the row's prompt as ComposerReplicationTrainer._tokenize_prompts renders it for TRL
        row = dataset_rows([rows[state["state_id"]]])[0]  # through the Arrow shape and back
        prompt = fit_prompt(tok, row["prompt"], 10**6, json.loads(row["tools"]))
        grpo = encoding.render_prompt_ids(tok, prompt, json.loads(row["tools"]))
        # training: the collator's row for the trace whose last turn is this state's recovery
        out = collator([sites[state["state_id"]]])
        ids, resp = out["input_ids"][0].tolist(), out["response_mask"][0].tolist()
        n = len(ev)
        assert list(grpo) == ev, state["state_id"]
        assert ids[:n] == ev, state["state_id"]
        # ... and the next tokens are the recorded recovery, the training target
        assert resp[n - 1] == 0 and resp[n] == 1
        recovery = sites[state["state_id"]]["turns"][-1]["content"]
        assert tok.decode(ids[n:]).startswith(
            wire.response_text(tok, recovery, wire.trace_tool_schemas(state))
        )
        assert wire.canonical_action(recovery) == wire.canonical_action(state["student_action"])
        shown = tok.decode(ev)  # what the model is shown: its tools and calls in the active format
        assert ("<tool_call>" in shown and "# Tools" in shown) == (fmt == "native")
        assert ("[TOOL_USE] name=" in shown and "[TOOL_RESULT name=" in shown) == (fmt == "text")
        checked[state["source"]] += 1
    assert checked == {"claude_code": 2, "codex": 2}


def test_teacher_prompt_is_the_state_conversation_plus_review_instructions(ingested):
    from composer_replication.teacher_replay.prompt import (
        TEACHER_INSTRUCTIONS,
        TEACHER_TOOL_INSTRUCTIONS,
        build_messages,
        request_tools,
    )

    state = ingested[0][5]
    # native (the default): the state's own OpenAI messages, calls as tool_calls, results as tool messages
    msgs = build_messages(state)
    assert msgs[1:] == wire.openai_messages(state["messages"])[1:]
    assert any(m.get("tool_calls") for m in msgs) and any(m["role"] == "tool" for m in msgs)
    assert msgs[0]["content"] == wire.SYSTEM_PROMPT + "\n\n" + TEACHER_TOOL_INSTRUCTIONS
    assert request_tools(state) == wire.trace_tool_schemas(state) != []
    # text (endpoints without tool support): the text format and an action line
    msgs = build_messages(state, mode="text")
    text = wire.text_messages(state["messages"])
    assert msgs[1:] == text[1:] and any("[TOOL_RESULT" in m["content"] for m in msgs)
    assert msgs[0]["content"].startswith(wire.TEXT_SYSTEM_PROMPT + "\nAvailable tools: ")
    assert msgs[0]["content"].endswith("\n\n" + TEACHER_INSTRUCTIONS)
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


def test_tool_results_hint_and_merging():
    res = wire.format_tool_result("Edit", "old_string not found", True)
    assert wire.parse_tool_result_head(res) == ("Edit", True)
    assert wire.parse_tool_result_head("plain text") is None
    turns = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": wire.format_tool_use("Edit", {"file_path": "a"})},
        {"role": "tool", "name": "Edit", "content": "boom", "tool_error": "boom"},
        {"role": "user", "content": "also this"},
        {"role": "context", "content": "(a reminder)"},
        {"role": "assistant", "content": ""},
    ]
    msgs, where = wire.turns_to_messages(turns, "sys")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert where == [1, 2, 3, 4, 4, 5]
    call = msgs[2]["tool_calls"][0]
    assert msgs[2]["content"] == "" and call["function"] == {
        "name": "Edit",
        "arguments": '{"file_path": "a"}',
    }
    assert msgs[3] == {"role": "tool", "tool_call_id": call["id"], "name": "Edit", "content": "boom",
                       "is_error": True}  # fmt: skip
    assert msgs[4]["content"] == "also this\n\n(a reminder)"
    before = [dict(m) for m in msgs]
    hinted = wire.add_hint(msgs[:4], "read the file first")
    assert msgs == before  # no mutation
    assert hinted[4] == {"role": "user", "content": "[HINT] read the file first"}  # after the failed result
    assert wire.add_hint(msgs[:5], "h")[4]["content"] == "also this\n\n(a reminder)\n\n[HINT] h"
    # merging a turn replaces the message object: a list holding the old one is not changed
    shared = msgs[:5]
    wire.append_turn(msgs := msgs[:5], {"role": "user", "content": "ok"})
    assert shared[4]["content"].endswith("(a reminder)") and msgs[4]["content"].endswith("\nok")
    # the text format: results merged with the user text that follows into one user message
    text = wire.text_messages(before)
    assert [m["role"] for m in text] == ["system", "user", "assistant", "user", "assistant"]
    assert text[3]["content"] == "[TOOL_RESULT name=Edit is_error=true]\nboom\n\nalso this\n\n(a reminder)"
    assert text[2]["content"] == wire.format_tool_use("Edit", {"file_path": "a"})
    assert wire.text_messages(wire.add_hint(before[:4], "h"))[3]["content"].endswith("boom\n\n[HINT] h")


def test_recorded_calls_keep_their_ids_and_results_answer_them():
    line_a, line_b = (
        wire.format_tool_use("Read", {"file_path": "a"}),
        wire.format_tool_use("Bash", {"command": "ls"}),
    )
    turns = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": f"Looking.\n\n{line_a}\n\n{line_b}",
         "tool_calls": [{"name": "Read", "arguments": {"file_path": "a"}, "id": "toolu_A"},
                        {"name": "Bash", "arguments": {"command": "ls"}, "id": "toolu_B"}]},
        {"role": "tool", "name": "Bash", "content": "x", "tool_error": None},  # answered out of order
        {"role": "tool", "name": "Read", "content": "y", "tool_error": None, "tool_call_id": "toolu_A"},
    ]  # fmt: skip
    msgs, _ = wire.turns_to_messages(turns)
    assert msgs[1]["content"] == "Looking." and [c["id"] for c in msgs[1]["tool_calls"]] == [
        "toolu_A",
        "toolu_B",
    ]
    assert [m["tool_call_id"] for m in msgs[2:]] == ["toolu_B", "toolu_A"]
    # metadata that the content does not show is not trusted: the content is parsed instead
    odd = wire.assistant_message("just text", [{"name": "Grep", "arguments": {"pattern": "x"}}])
    assert odd == {"role": "assistant", "content": "just text"}
    # a malformed answer stays text: the model sees what it wrote
    bad = '<tool_call>{"name": "Bash", "arguments": {oops}</tool_call>'
    assert wire.assistant_message(bad) == {"role": "assistant", "content": bad}


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
    from composer_replication.datagen.tools import TOOL_SCHEMAS
    from composer_replication.pipeline.grpo_phase import task_rows

    tasks, rows = task_rows([])
    for row in rows:
        task = tasks[row["task"]]
        assert row["prompt"] == task_prompt(task) and row["tools"] == TOOL_SCHEMAS
        assert row["prompt"][0]["content"] == wire.SYSTEM_PROMPT
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
        if path.parent.name == "wire":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{no}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
