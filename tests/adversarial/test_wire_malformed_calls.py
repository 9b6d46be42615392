"""Hostile tool calls from a model, a server or a teacher: arguments that are not JSON, unknown tools,
empty names, thousands of calls, a chat template that raises on ``tools``. Each one is booked as a
malformed call with one clear line; nothing crashes and nothing is lost."""

from __future__ import annotations

import json

import pytest

from composer_replication import wire

STATE = {"student_action": wire.format_tool_use("Bash", {"command": "ls"}), "tools": ["Bash", "Read"]}


def _call(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_call('{"name": "Bash", "arguments": {"command": "ls"'), "not valid JSON"),
        (_call('{"name": "Bash", "arguments": "{not json}"}'), "Bash: arguments are not valid JSON"),
        (_call('{"name": "Bash", "arguments": ["ls"]}'), "Bash: arguments must be a JSON object, got list"),
        (_call('{"name": "", "arguments": {}}'), "empty tool name"),
        (_call('{"arguments": {"command": "ls"}}'), "empty tool name"),
        (_call('{"name": "Ba sh", "arguments": {}}'), "bad tool name"),
        (_call('["Bash", {"command": "ls"}]'), "must be a JSON object, got list"),
        (_call('{"name": "Bash", "arguments": {}} and then some'), "text after the JSON object"),
        ("[TOOL_USE] name=Bash input={oops", "tool Bash: input is not valid JSON"),
    ],
)
def test_a_malformed_call_is_one_line_and_scores_malformed(answer, error):
    parsed = wire.parse_action("Let me look.\n" + answer)
    assert not parsed.ok and len(parsed.errors) == 1 and error in parsed.errors[0]
    assert "\n" not in parsed.errors[0]
    score = wire.score_action(answer, STATE)
    assert not score["well_formed"] and not score["valid"] and not score["exact"]
    assert error in score["error"]
    assert wire.canonical_action(answer) is None
    # a sandbox gets the call as an ``_invalid`` entry in its place: a tool error, not silence
    calls = wire.tool_calls(answer)
    assert len(calls) == 1 and calls[0]["name"] == "_invalid" and error in calls[0]["input"]["error"]


def test_an_unknown_tool_is_well_parsed_but_not_valid_for_the_session():
    answer = _call('{"name": "rm_rf", "arguments": {"path": "/"}}')
    assert wire.parse_action(answer).ok
    score = wire.score_action(answer, STATE)
    assert not score["well_formed"] and score["error"] == "unknown tool 'rm_rf'"


def test_thousands_of_calls_are_capped_and_booked():
    one = _call('{"name": "Bash", "arguments": {"command": "ls"}}')
    answer = "\n".join([one] * 5000)
    parsed = wire.parse_action(answer)
    assert len(parsed.tool_calls) == wire.MAX_TOOL_CALLS
    assert parsed.errors == (f"5000 tool calls in one answer (at most {wire.MAX_TOOL_CALLS})",)
    assert not wire.score_action(answer, STATE)["valid"]
    calls = wire.tool_calls(answer)
    assert len(calls) == wire.MAX_TOOL_CALLS + 1 and calls[-1]["name"] == "_invalid"
    # a malformed call among thousands: the errors stay a few lines
    many_bad = "\n".join([_call("{oops")] * 3000)
    assert len(wire.parse_action(many_bad).errors) <= 8


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {"content": None, "tool_calls": [{"function": {"name": "Bash", "arguments": "{oops"}}]},
            "not valid JSON",
        ),
        ({"content": "", "tool_calls": [{"function": {"name": "", "arguments": "{}"}}]}, "empty tool name"),
        ({"content": "", "tool_calls": [{"type": "function"}]}, "empty tool name"),
        ({"content": "", "tool_calls": ["Bash"]}, "empty tool name"),
        ({"content": "", "tool_calls": [{"function": {"name": "Bash", "arguments": "[1]"}}]}, "got list"),
    ],
)
def test_malformed_openai_tool_calls_from_a_server(message, error):
    parsed = wire.parse_openai_message(message)
    assert not parsed.ok and error in parsed.errors[0]


def test_a_server_answer_and_its_text_parse_to_the_same_calls():
    args = {"file_path": "a.py", "old_string": "x = 1", "new_string": "x = 2"}
    served = {
        "role": "assistant",
        "content": "Fixing it.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "Edit", "arguments": json.dumps(args)}}
        ],
    }
    hermes = "Fixing it.\n" + _call(json.dumps({"name": "Edit", "arguments": args}))
    text = "Fixing it.\n\n" + wire.format_tool_use("Edit", args)
    got = [wire.parse_openai_message(served), wire.parse_action(hermes), wire.parse_action(text)]
    assert got[0] == got[1] == got[2] and got[0].tool_calls == (("Edit", args),)
    assert wire.parse_openai_message(None).errors == ("no response",)


def test_a_template_that_raises_on_tools_is_one_line(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{% if tools %}{{ raise_exception('this template cannot take tools') }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if message is defined and message.tool_calls %}{% endif %}"
    )
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="chat template raised .*cannot take tools") as info:
        wire.render(tok, msgs, [{"type": "function", "function": {"name": "Bash", "parameters": {}}}])
    assert "\n" not in str(info.value)
    # a non-ChatML template without tool support is refused with one line, not rendered wrongly
    tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    with pytest.raises(ValueError, match="no tool support and is not ChatML"):
        wire.render(tok, msgs)
    with wire.use_format("text"):  # the text format needs no tool support
        assert wire.render(tok, msgs) == "[user] hi\n"


def test_a_bad_format_setting_is_one_line(monkeypatch):
    with pytest.raises(ValueError, match="use one of native, text"):
        wire.set_format("xml")
    monkeypatch.setitem(wire._render._state, "format", "json")
    with pytest.raises(ValueError, match="COMPOSER_WIRE_FORMAT='json'"):
        wire.get_format()
