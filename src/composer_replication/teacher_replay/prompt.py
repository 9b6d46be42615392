"""The teacher prompt and the worst-case token bound used for budget reservations."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from composer_replication import wire

# Review instructions on top of the agent's own system message: the conversation is the student's, in the
# text format (``wire.text_messages``); only the task differs (name the next action, no commentary).
TEACHER_INSTRUCTIONS = (
    "You are reviewing a coding agent's session. Given the conversation so far, output the single best "
    "NEXT action of the assistant, in exactly the agent's action format:\n"
    f"- To call a tool, write one line: {wire.ACTION_FORMAT}\n"
    "  (the JSON must be valid and on that one line; several tool calls go on separate lines, separated "
    "by a blank line)\n"
    "- Otherwise write the assistant's reply as plain text.\n"
    "Do not explain your choice, do not use code fences, and do not write [THINKING] blocks."
)

# Chat templates add a few special tokens per message and around the reply; this bounds them.
_PER_MESSAGE_OVERHEAD_TOKENS = 16
_PER_REQUEST_OVERHEAD_TOKENS = 64


def build_messages(state: dict[str, Any], *, tools: list[str] | None = None) -> list[dict[str, str]]:
    """The state's conversation in the text format (``wire.text_messages``: teachers are asked for an
    action line) with the review instructions appended to its system message; a state without one gets
    ``wire.system_text`` of its tools first."""
    tools = tools if tools is not None else state.get("tools")
    msgs = wire.text_messages(state["messages"])
    if not msgs or msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": wire.system_text(tools)})
    system = msgs[0]["content"]
    tools_line = wire.system_text(tools, base="").strip()
    if tools_line and tools_line not in system:  # states from older ingests, or a custom system prompt
        system += "\n" + tools_line
    msgs[0] = {"role": "system", "content": system + "\n\n" + TEACHER_INSTRUCTIONS}
    return msgs


def prompt_token_bound(messages: list[dict[str, str]]) -> int:
    """An upper bound on the prompt's token count for byte-level BPE tokenizers.

    Every token of a byte-level BPE (GPT, Claude, Llama 3, Qwen, DeepSeek) covers at least one UTF-8
    byte, so the byte count bounds the text tokens; the chat-template tokens are bounded by the
    per-message overhead. Real counts are ~4x lower: this is a reservation, not an estimate.
    """
    n_bytes = sum(len(json.dumps(m["content"], ensure_ascii=False).encode()) for m in messages)
    return n_bytes + _PER_MESSAGE_OVERHEAD_TOKENS * len(messages) + _PER_REQUEST_OVERHEAD_TOKENS


def prompt_token_estimate(messages: list[dict[str, str]]) -> int:
    """A typical prompt token count (~4 bytes per token), for expected-cost estimates."""
    n_bytes = sum(len(m["content"].encode()) for m in messages)
    return math.ceil(n_bytes / 4) + 4 * len(messages) + 8


def worst_case_usd(prompt_tokens: int, max_tokens: int, spec: Mapping[str, Any]) -> float:
    return (prompt_tokens * spec["input_per_mtok"] + max_tokens * spec["output_per_mtok"]) / 1e6


def cost_from_tokens(prompt_tokens: int, completion_tokens: int, spec: Mapping[str, Any]) -> float:
    return (prompt_tokens * spec["input_per_mtok"] + completion_tokens * spec["output_per_mtok"]) / 1e6
