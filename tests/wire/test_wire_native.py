"""Native tool calls: the project's Hermes template renders like ChatML without tools, renders every
prefix of a conversation as a prefix of the whole, and writes calls that transformers' own response
parser (what ``transformers serve`` answers with) reads back as the same calls ``wire`` reads."""

from __future__ import annotations

import copy
import json

import pytest

from composer_replication import tool_schemas, wire
from composer_replication.models import CHATML_TEMPLATE

TOOLS = tool_schemas.tools_for("claude_code", ["Bash", "Read", "Edit"])
ARGS = {"file_path": "src/app.py", "old_string": "x = 1\n", "new_string": 'x = "é"\n'}


def _conversation() -> list[dict]:
    turns = [
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "Looking first.\n\n" + wire.format_tool_use("Read", {"file_path": "a.py"})
         + "\n\n" + wire.format_tool_use("Bash", {"command": "pytest -x"})},
        {"role": "tool", "name": "Read", "content": "x = 1", "tool_error": None},
        {"role": "tool", "name": "Bash", "content": "1 failed", "tool_error": "1 failed"},
        {"role": "assistant", "content": wire.format_tool_use("Edit", ARGS)},
        {"role": "tool", "name": "Edit", "content": "ok", "tool_error": None},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "Done: the test passes."},
    ]  # fmt: skip
    return wire.turns_to_messages(turns, wire.SYSTEM_PROMPT)[0]


@pytest.fixture()
def tok(tiny_tokenizer):
    t = copy.deepcopy(tiny_tokenizer)  # prepare_tokenizer changes the template in place
    t.chat_template = CHATML_TEMPLATE  # as built: other tests' renders may have prepared the shared one
    return t


def test_without_tools_the_hermes_template_is_plain_chatml(tok):
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]
    chatml = tok.apply_chat_template(msgs, tokenize=False)
    assert not wire.supports_tools(tok)
    assert wire.render(tok, msgs, add_generation_prompt=False) == chatml
    assert tok.chat_template == wire.HERMES_TEMPLATE and wire.supports_tools(tok)
    with wire.use_format("text"):
        tok2 = copy.deepcopy(tok)
        tok2.chat_template = CHATML_TEMPLATE
        wire.render(tok2, msgs)
        assert tok2.chat_template == CHATML_TEMPLATE  # the text format leaves the template alone


def test_every_prefix_renders_as_a_prefix_of_the_whole(tok):
    msgs = _conversation()
    whole = wire.render(tok, msgs, TOOLS, add_generation_prompt=False)
    assert whole.count('<tool_call>\n{"name": "') == 3 and whole.count("<tool_response>") == 3
    assert json.dumps(TOOLS[0]) in whole  # the schemas, in the system turn
    for k in range(1, len(msgs)):
        assert whole.startswith(wire.render(tok, msgs[:k], TOOLS, add_generation_prompt=False))
        if msgs[k]["role"] == "assistant":
            assert whole.startswith(wire.render(tok, msgs[:k], TOOLS))  # the generation prompt too


def test_transformers_response_parser_reads_the_same_calls(tok):
    """What a server parses from the model's answer is what ``wire`` parses from it."""
    msgs = _conversation()
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = wire.render(tok, msgs[:k], TOOLS)
        answer = wire.render(tok, msgs[: k + 1], TOOLS, add_generation_prompt=False)[len(prompt) :]
        answer = answer[: answer.index("<|im_end|>") + len("<|im_end|>")]  # generation stops at end of turn
        served = tok.parse_response(answer, schema=wire.HERMES_RESPONSE_TEMPLATE, prefix=prompt)
        ours = wire.parse_action(answer)
        theirs = wire.parse_openai_message(
            {
                "content": served.get("content"),
                "tool_calls": [{"function": c["function"]} for c in served.get("tool_calls") or []],
            }
        )
        assert ours.ok and theirs.ok and ours.tool_calls == theirs.tool_calls
        want = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls") or []
        ]
        assert list(ours.tool_calls) == want
        assert (served.get("content") or "").strip() == m["content"].strip()


def test_response_text_is_the_assistant_body_in_either_format(tok):
    action = "Editing.\n\n" + wire.format_tool_use("Edit", ARGS)
    body = wire.response_text(tok, action, TOOLS)
    assert (
        body
        == 'Editing.\n<tool_call>\n{"name": "Edit", "arguments": '
        + json.dumps(ARGS, ensure_ascii=False)
        + "}\n</tool_call>"
    )
    assert wire.canonical_action(body) == wire.canonical_action(action)
    assert wire.response_text(tok, "All done.", TOOLS) == "All done."
    with wire.use_format("text"):
        assert wire.response_text(tok, action, TOOLS) == action


def test_the_text_format_is_the_earlier_rendering(tok):
    msgs = _conversation()[:5]
    with wire.use_format("text"):
        text = wire.render(tok, msgs, ["Bash", "Read", "Edit"])
    assert text.startswith(
        "<|im_start|>system\n" + wire.TEXT_SYSTEM_PROMPT + "\nAvailable tools: Bash, Read, Edit."
    )
    assert '[TOOL_USE] name=Read input={"file_path": "a.py"}\n\n[TOOL_USE] name=Bash' in text
    assert (
        "[TOOL_RESULT name=Read is_error=false]\nx = 1\n\n[TOOL_RESULT name=Bash is_error=true]\n1 failed"
        in text
    )
    assert "<tool_call>" not in text and "<tool_response>" not in text


def test_fit_messages_keeps_the_system_message_and_no_orphan_results(tok):
    msgs = _conversation()
    full = len(wire.render_ids(tok, msgs, TOOLS))
    for cap in (full - 1, full // 2, 10):
        fitted = wire.fit_messages(tok, msgs, cap, TOOLS)
        assert fitted[0] == msgs[0] and fitted[-1]["role"] == msgs[-1]["role"]
        assert fitted[1]["role"] != "tool" or len(fitted) == 2  # a result without its call goes with it
        assert len(wire.render_ids(tok, fitted, TOOLS)) <= max(
            cap, len(wire.render_ids(tok, fitted[:1] + fitted[-1:], TOOLS))
        )
    assert wire.fit_messages(tok, msgs, full, TOOLS) == msgs


def test_openai_messages_drop_the_projects_own_keys():
    msgs = _conversation()
    out = wire.openai_messages(msgs)
    assert all("is_error" not in m for m in out)
    assert out[4]["tool_call_id"] == msgs[2]["tool_calls"][1]["id"] == out[2]["tool_calls"][1]["id"]
