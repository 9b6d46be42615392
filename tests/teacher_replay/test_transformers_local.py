"""The in-process transformers teacher (``teacher_replay.backends.transformers_local``) on the tiny model."""

from __future__ import annotations

import asyncio

from composer_replication.teacher_replay import replay_trace

from ._replay_inputs import make_states


def test_transformers_backend_with_tiny_model(tiny_model_dir):
    teachers = [
        {"slug": "local/tiny", "input_per_mtok": 0.0, "output_per_mtok": 0.0, "backend": "transformers",
         "model_path": str(tiny_model_dir)},
    ]  # fmt: skip
    res = asyncio.run(replay_trace(make_states(2), teachers, max_total_usd=0.0, max_tokens=8))
    assert [r["error"] for r in res] == [None, None]
    for r in res:
        assert isinstance(r["response_text"], str)
        assert r["prompt_tokens"] > 10 and 1 <= r["completion_tokens"] <= 8 and r["cost_usd"] == 0.0
    # greedy decoding: the same state gives the same answer
    again = asyncio.run(replay_trace(make_states(1), teachers, max_total_usd=0.0, max_tokens=8))
    assert again[0]["response_text"] == res[0]["response_text"]


def test_transformers_teacher_is_asked_with_the_tools_and_answers_with_parsed_calls(tiny_model_dir):
    from composer_replication import encoding, wire
    from composer_replication.models import load_model_and_tokenizer
    from composer_replication.teacher_replay.backends.transformers_local import endpoint_answer
    from composer_replication.teacher_replay.plan import plan_calls

    teachers = [
        {"slug": "local/tiny", "input_per_mtok": 0.0, "output_per_mtok": 0.0, "backend": "transformers",
         "model_path": str(tiny_model_dir)},
    ]  # fmt: skip
    states = make_states(1)
    (call,) = plan_calls(states, teachers, max_tokens=4)
    assert [t["function"]["name"] for t in call.request.tools] == ["Read", "Bash", "Edit"]
    (res,) = asyncio.run(replay_trace(states, teachers, max_total_usd=0.0, max_tokens=4))
    _, tok = load_model_and_tokenizer(str(tiny_model_dir))
    with_tools = encoding.render_prompt_ids(tok, call.request.messages, call.request.tools)
    assert (
        res["prompt_tokens"] == len(with_tools) > len(encoding.render_prompt_ids(tok, call.request.messages))
    )
    # a Hermes answer comes back as the endpoint's tool_calls: the same parsed call either way
    raw = 'Looking.\n<tool_call>\n{"name": "Read", "arguments": {"file_path": "a.py"}}\n</tool_call>'
    text, calls = endpoint_answer(raw)
    assert text == "Looking." and calls is not None
    assert wire.parse_openai_message({"content": text, "tool_calls": calls}) == wire.parse_action(raw)
    bad = '<tool_call>{"name": "Read", "arguments": {oops</tool_call>'
    assert endpoint_answer(bad) == (bad, None)  # malformed: kept raw, read as malformed
