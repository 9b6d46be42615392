"""A server's hostile ``tool_calls`` and ``logprobs`` reach the generation path without crashing it:
each malformed call is kept as a malformed call (``_invalid``, or a name no session has), the text is
kept, keys are scrubbed, and thousands of calls are read in bounded time."""

from __future__ import annotations

import json
import time

import pytest

from composer_replication.generation import tool_calls
from composer_replication.generation.types import action_text
from composer_replication.teacher_replay.backends.base import TeacherError
from composer_replication.teacher_replay.backends.openai_compat import parse_response
from composer_replication.teacher_replay.endpoint import to_completion
from composer_replication.teacher_replay.keys import REDACTED_KEY, KeyScrubber
from composer_replication.wire import MAX_TOOL_CALLS

KEY = "sk-test-endpoint-0123456789abcdef"


def _read(message: dict, **choice) -> list[dict]:
    raw = json.dumps({"choices": [{"message": message, "finish_reason": "tool_calls", **choice}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()  # fmt: skip
    return tool_calls(to_completion(parse_response(200, {}, raw, KeyScrubber([KEY]))))


def _fn(name, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("call", "want"),
    [
        (_fn("Bash", "{not json"), "_invalid"),  # arguments that are not JSON
        (_fn("Bash", '["ls"]'), "_invalid"),  # JSON, not an object
        (_fn("Bash", 42), "_invalid"),
        (_fn("", "{}"), "_invalid"),  # empty name
        (_fn("two words", "{}"), "_invalid"),
        (_fn(None, "{}"), "_invalid"),
        ({"type": "function", "function": "Bash"}, "_invalid"),  # function is not an object
        ("Bash", "_invalid"),
        (_fn("NoSuchTool", '{"x": 1}'), "NoSuchTool"),  # unknown tools stay what they are: scored as such
    ],
)
def test_each_malformed_call_is_one_malformed_call(call, want):
    got = _read({"content": "prose kept", "tool_calls": [call, _fn("Read", '{"file_path": "a.py"}')]})
    assert [c["name"] for c in got] == [want, "Read"]
    if want == "_invalid":  # with the reason, for the tool error the agent gets back
        assert got[0]["input"]["error"]


def test_tool_calls_that_are_not_a_list_leave_the_text():
    for junk in ("Bash", {"name": "Bash"}, 7):
        assert _read({"content": "just text", "tool_calls": junk}) == []
    with pytest.raises(TeacherError, match="without choices"):
        _read({"role": "assistant"})  # neither content nor calls: retryable, as before


def test_thousands_of_calls_are_read_in_bounded_time():
    calls = [_fn("Bash", json.dumps({"command": f"echo {i}"})) for i in range(5000)]
    t0 = time.perf_counter()
    got = _read({"content": None, "tool_calls": calls})
    # read in bounded time, and booked as malformed past wire.MAX_TOOL_CALLS (runaway generation)
    assert time.perf_counter() - t0 < 10
    assert len(got) == MAX_TOOL_CALLS + 1 and got[MAX_TOOL_CALLS - 1]["input"] == {"command": "echo 63"}
    assert got[-1]["name"] == "_invalid" and "5000 tool calls" in got[-1]["input"]["error"]


def test_an_echoed_key_is_scrubbed_from_the_calls():
    got = _read({"content": "", "tool_calls": [_fn("Bash", json.dumps({"command": f"echo Bearer {KEY}"}))]})
    assert KEY not in json.dumps(got) and REDACTED_KEY in got[0]["input"]["command"]


@pytest.mark.parametrize(
    "logprobs",
    [{"content": [{"logprob": "high"}]}, {"content": [{"logprob": 0.5}]}, {"content": [{"logprob": True}]},
     {"content": "x"}, [1, 2], {"content": [{"token": "a"}]}],
)  # fmt: skip
def test_garbage_logprobs_are_dropped_not_trusted(logprobs):
    raw = json.dumps({"choices": [{"message": {"content": "a"}, "logprobs": logprobs}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()  # fmt: skip
    c = to_completion(parse_response(200, {}, raw))
    assert c.logprobs is None and action_text(c) == "a"
