"""The teacher prompt and the worst-case token bound used for budget reservations."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from composer_replication import tool_schemas, wire

# Review instructions on top of the agent's own system message. ``native`` (the default): the conversation
# is the student's as OpenAI messages (assistant ``tool_calls``, ``tool`` results) and the session's tool
# schemas go in the request's ``tools``; the teacher answers by calling them. ``text``: for endpoints
# without tool support, the conversation in the text format (``wire.text_messages``) and an action line.
TEACHER_TOOL_INSTRUCTIONS = (
    "You are reviewing a coding agent's session. Given the conversation so far, take the single best "
    "NEXT action of the assistant: call the tool or tools it should call now, with the tools provided, "
    "or, when no tool call is needed, write the assistant's reply as plain text. Do not explain your choice."
)
TEACHER_INSTRUCTIONS = (
    "You are reviewing a coding agent's session. Given the conversation so far, output the single best "
    "NEXT action of the assistant, in exactly the agent's action format:\n"
    f"- To call a tool, write one line: {wire.ACTION_FORMAT}\n"
    "  (the JSON must be valid and on that one line; several tool calls go on separate lines, separated "
    "by a blank line)\n"
    "- Otherwise write the assistant's reply as plain text.\n"
    "Do not explain your choice, do not use code fences, and do not write [THINKING] blocks."
)
TOOL_MODES = ("native", "text")
_NO_RESULT = "(no result was recorded for this call)"

# Chat templates add a few special tokens per message and around the reply; this bounds them.
_PER_MESSAGE_OVERHEAD_TOKENS = 16
_PER_REQUEST_OVERHEAD_TOKENS = 64
# A request with ``tools``: the provider's own tool-use preamble, and the template's tokens per tool.
_TOOLS_OVERHEAD_TOKENS = 1024
_PER_TOOL_OVERHEAD_TOKENS = 32


def request_tools(state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool schemas a teacher is asked with: the state's session schemas (``tool_schemas``, else
    ``tool_schemas.tools_for`` of its source and tools), else those of the calls its messages make."""
    schemas = wire.trace_tool_schemas(state)
    if schemas:
        return schemas
    seen: dict[str, list[Any]] = {}
    for m in state.get("messages") or []:
        for name, args in wire.parse_openai_message({"tool_calls": m.get("tool_calls") or []}).tool_calls:
            seen.setdefault(name, []).append(args)
    return tool_schemas.tools_for(state.get("source"), seen) if seen else []


_HARNESS_TOOLS = {"claude_code": tool_schemas.CLAUDE_CODE_TOOLS, "codex": tool_schemas.CODEX_TOOLS}


def tool_names(state: Mapping[str, Any]) -> tuple[str, ...]:
    """The tools a teacher may call: those of :func:`request_tools` and every standard tool of the
    session's harness (a session's schemas list the tools it used, but its harness offered them all, so
    a teacher's ``Bash`` in a session that never ran one is a real action); any other tool is malformed."""
    names = dict.fromkeys(tool_schemas.tool_names(request_tools(state)))
    names.update(dict.fromkeys(_HARNESS_TOOLS.get(str(state.get("source")), {})))
    return tuple(names)


def _paired(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages an OpenAI-compatible API accepts: every assistant call answered by a ``tool`` message
    (a result the log lacks becomes a note saying so), and a ``tool`` result without its call shown as
    user text in the text format's result header."""
    out: list[dict[str, Any]] = []
    pending: list[tuple[str, str]] = []

    def flush() -> None:
        out.extend({"role": "tool", "tool_call_id": i, "name": n, "content": _NO_RESULT} for i, n in pending)
        pending.clear()

    for m in messages:
        role = m.get("role")
        if role == "tool" and any(i == m.get("tool_call_id") for i, _ in pending):
            pending[:] = [(i, n) for i, n in pending if i != m.get("tool_call_id")]
            out.append(m)
            continue
        flush()
        if role == "tool":
            name, content = str(m.get("name") or "tool"), str(m.get("content") or "")
            text = wire.format_tool_result(name, content, bool(m.get("is_error")))
            if out and out[-1].get("role") == "user":
                out[-1] = {"role": "user", "content": out[-1]["content"] + wire.ACTION_SEP + text}
            else:
                out.append({"role": "user", "content": text})
            continue
        out.append(m)
        if role == "assistant":
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, Mapping)]
            pending = [(str(c.get("id")), str((c.get("function") or {}).get("name"))) for c in calls]
    flush()
    return out


def build_messages(
    state: dict[str, Any], *, tools: list[str] | None = None, mode: str = "native"
) -> list[dict[str, Any]]:
    """The state's conversation as a teacher is asked it, review instructions appended to its system
    message (a state without one gets the agent's first). ``native``: OpenAI messages (``wire``'s, the
    project's own keys dropped), sent with :func:`request_tools`; ``text``: the text format
    (``wire.text_messages``) with the tools spelled out in the system message."""
    if mode == "native":
        msgs = _paired(wire.openai_messages(state["messages"]))
        if not msgs or msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": wire.SYSTEM_PROMPT})
        msgs[0] = {"role": "system", "content": f"{msgs[0]['content']}\n\n{TEACHER_TOOL_INSTRUCTIONS}"}
        return msgs
    if mode != "text":
        raise ValueError(f"tool_mode must be one of {TOOL_MODES}, got {mode!r}")
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


def _tools_bytes(tools: list[dict[str, Any]] | None) -> int:
    return len(json.dumps(tools, ensure_ascii=False).encode()) if tools else 0


def _message_bytes(m: Mapping[str, Any]) -> int:
    """The bytes of what a model reads of a message: its content, and its calls or call id."""
    n = len(json.dumps(m.get("content") or "", ensure_ascii=False).encode())
    if m.get("tool_calls"):
        n += len(json.dumps(m["tool_calls"], ensure_ascii=False).encode())
    return n + len(str(m.get("tool_call_id") or "").encode())


def prompt_token_bound(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """An upper bound on the prompt's token count for byte-level BPE tokenizers.

    Every token of a byte-level BPE (GPT, Claude, Llama 3, Qwen, DeepSeek) covers at least one UTF-8
    byte, so the byte count bounds the text tokens; the chat-template tokens are bounded by the
    per-message overhead. ``tools`` add their JSON bytes, a template overhead per tool and the
    provider's tool-use preamble. Real counts are ~4x lower: this is a reservation, not an estimate.
    """
    n_bytes = sum(_message_bytes(m) for m in messages) + _tools_bytes(tools)
    bound = n_bytes + _PER_MESSAGE_OVERHEAD_TOKENS * len(messages) + _PER_REQUEST_OVERHEAD_TOKENS
    return bound + (_TOOLS_OVERHEAD_TOKENS + _PER_TOOL_OVERHEAD_TOKENS * len(tools) if tools else 0)


def prompt_token_estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int:
    """A typical prompt token count (~4 bytes per token), for expected-cost estimates."""
    n_bytes = sum(_message_bytes(m) for m in messages) + _tools_bytes(tools)
    return math.ceil(n_bytes / 4) + 4 * len(messages) + 8


def worst_case_usd(prompt_tokens: int, max_tokens: int, spec: Mapping[str, Any]) -> float:
    return (prompt_tokens * spec["input_per_mtok"] + max_tokens * spec["output_per_mtok"]) / 1e6


def cost_from_tokens(prompt_tokens: int, completion_tokens: int, spec: Mapping[str, Any]) -> float:
    return (prompt_tokens * spec["input_per_mtok"] + completion_tokens * spec["output_per_mtok"]) / 1e6
