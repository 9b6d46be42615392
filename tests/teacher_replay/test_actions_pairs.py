"""Student-action parsing, canonical agreement, and consensus pair extraction."""

from __future__ import annotations

import json

import pytest

from composer_replication._io import read_jsonl
from composer_replication.teacher_replay import extract_dpo_pairs, save_pairs
from composer_replication.teacher_replay.actions import canonical_action, format_tool_use, parse_action

READ_AB = '[TOOL_USE] name=Read input={"a": 1, "b": [1, 2]}'
READ_BA = '[TOOL_USE] name=Read input={"b":[1,2],"a":1}'
STUDENT = '[TOOL_USE] name=Bash input={"command": "ls"}'


def test_canonical_action_forms():
    assert canonical_action(READ_AB) == canonical_action(READ_BA) == (("Read", '{"a":1,"b":[1,2]}'),)
    # prose around a tool call, a code fence and a thinking block do not change the action
    wrapped = "```\n[THINKING] I should read it\n\nSure.\n" + READ_BA + "\n```"
    assert canonical_action(wrapped) == canonical_action(READ_AB)
    assert canonical_action("Done.   The  tests\npass.") == canonical_action("Done. The tests pass.")
    assert canonical_action('[TOOL_USE] name=Read input={"a": 1,}') is None  # malformed JSON
    assert canonical_action("   ") is None and canonical_action(None) is None
    two = format_tool_use("Read", {"x": "é"}) + "\n\n" + format_tool_use("Bash", {"command": "ls"})
    assert [n for n, _ in parse_action(two).tool_calls] == ["Read", "Bash"]
    assert canonical_action(two) != canonical_action(format_tool_use("Read", {"x": "é"}))


def _state(sid="s0", student=STUDENT):
    return {"state_id": sid, "messages": [{"role": "user", "content": "go"}], "student_action": student}


def _res(sid, slug, text, error=None):
    return {
        "state_id": sid, "teacher_slug": slug, "response_text": None if error else text, "latency_s": 0.1,
        "prompt_tokens": 1, "completion_tokens": 1, "cost_usd": 0.0, "error": error,
    }  # fmt: skip


def test_pair_when_teachers_agree_modulo_key_order():
    results = [_res("s0", "a", READ_AB), _res("s0", "b", READ_BA), _res("s0", "c", "I would run the tests.")]
    pairs = extract_dpo_pairs([_state()], results, agreement_threshold=2)
    assert len(pairs) == 1
    p = pairs[0]
    assert p["n_teachers_agreeing"] == 2 and p["chosen"] == READ_AB and p["rejected"] == STUDENT
    assert p["state_messages"] == [{"role": "user", "content": "go"}]
    assert extract_dpo_pairs([_state()], results, agreement_threshold=3) == []


def test_no_pair_when_student_agrees_or_tie_or_malformed():
    agree = [_res("s0", "a", READ_AB), _res("s0", "b", READ_BA)]
    assert extract_dpo_pairs([_state(student=READ_BA)], agree) == []
    tie = agree + [
        _res("s0", "c", STUDENT.replace("ls", "pwd")),
        _res("s0", "d", STUDENT.replace("ls", "pwd")),
    ]
    assert extract_dpo_pairs([_state()], tie) == []
    malformed = [_res("s0", "a", '[TOOL_USE] name=Read input={"a": 1'), _res("s0", "b", READ_AB)]
    assert extract_dpo_pairs([_state()], malformed) == []  # only one well-formed vote
    errors = [_res("s0", "a", None, error="HTTP 500"), _res("s0", "b", READ_AB), _res("s0", "c", READ_BA)]
    assert extract_dpo_pairs([_state()], errors)[0]["n_teachers_agreeing"] == 2
    # the same teacher twice (e.g. a cache with two rows) votes once
    dup = [_res("s0", "a", READ_AB), _res("s0", "a", READ_BA)]
    assert extract_dpo_pairs([_state()], dup) == []
    with pytest.raises(ValueError, match="agreement_threshold"):
        extract_dpo_pairs([_state()], agree, agreement_threshold=0)


def test_save_pairs_roundtrip(tmp_path):
    pairs = extract_dpo_pairs([_state()], [_res("s0", "a", READ_AB), _res("s0", "b", READ_BA)])
    out = tmp_path / "deep" / "pairs.jsonl"
    save_pairs(pairs, out)
    assert list(read_jsonl(out)) == json.loads(json.dumps(pairs))
    assert [p.name for p in out.parent.iterdir()] == ["pairs.jsonl"]  # no temp file left behind


def test_pairs_carry_the_states_tool_schemas_through_normalisation(tiny_tokenizer):
    """A pair's prompt renders with its state's tools, as the state does everywhere else."""
    from composer_replication import encoding, tool_schemas, wire
    from composer_replication.replaysim.normalize import _to_normalized
    from composer_replication.trainer.pair_tokens import encode_pairs, pair_tools

    tools = tool_schemas.tools_for("claude_code", ["Bash", "Read"])
    state = {**_state(), "tool_schemas": tools}
    results = [_res("s0", "a", READ_AB), _res("s0", "b", READ_BA)]
    pair = extract_dpo_pairs([state], results)[0]
    assert pair["tools"] == tools and pair_tools(pair) == tools
    assert "tools" not in extract_dpo_pairs([_state()], results)[0]  # states without schemas: as before
    normalized = _to_normalized(pair, {"op": "x"})
    assert pair_tools(normalized) == tools and normalized.metadata["op"] == "x"
    enc = encode_pairs(tiny_tokenizer, [pair])
    prompt = encoding.render_prompt_ids(tiny_tokenizer, pair["state_messages"], tools)
    assert enc["dpo_chosen_input_ids"][0, : len(prompt)].tolist() == prompt  # the tools block included
    body = tiny_tokenizer.decode(enc["dpo_chosen_input_ids"][0][enc["dpo_chosen_response_mask"][0].bool()])
    assert body == wire.response_text(tiny_tokenizer, READ_AB, tools) + "<|im_end|>"
