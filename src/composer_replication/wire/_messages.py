"""Messages: traces and sandbox tasks as OpenAI-style chat messages (assistant ``tool_calls``, ``tool``
results with their error flag), the SDPO hint, and the text format's rewrite of the same messages."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from composer_replication import tool_schemas
from composer_replication.wire._actions import (
    ACTION_FORMAT,
    ACTION_SEP,
    THINKING_TAG,
    _parse,
    action_text,
    format_tool_result,
    format_tool_use,
)

# ----------------------------------------------------------------------------------------- system

SYSTEM_PROMPT = (
    "You are a senior software engineer working as a coding agent in a terminal environment. "
    "Work step by step with the tools you are given: look before you change, then check what you did. "
    "Reply without a tool call when the task is done."
)
# The text format's system prompt: the action format spelled out, with an example call.
TEXT_SYSTEM_PROMPT = (
    "You are a senior software engineer working as a coding agent in a terminal environment. "
    f"To call a tool, write one line: {ACTION_FORMAT}, for example\n"
    + format_tool_use("Bash", {"command": "ls"})
    + "\nResults come back as [TOOL_RESULT name=<tool> is_error=<true|false>] messages. "
    "Reply without a tool call when the task is done."
)


def _tool_line(tool: str | Mapping[str, Any]) -> str:
    fn: Mapping[str, Any] = tool.get("function", tool) if isinstance(tool, Mapping) else {"name": str(tool)}
    props = (fn.get("parameters") or {}).get("properties") or {}
    args = json.dumps({k: (v or {}).get("description", "") for k, v in props.items()}, ensure_ascii=False)
    desc = str(fn.get("description") or "").strip()
    return f"- {fn['name']} input={args}" + (f": {desc}" if desc else "")


def system_text(tools: Iterable[str | Mapping[str, Any]] | None = None, base: str | None = None) -> str:
    """The text format's system message: ``base`` (default :data:`TEXT_SYSTEM_PROMPT`) and the tools,
    as names (``Available tools: Bash, Read.``) or schemas (each listed with its arguments)."""
    text = TEXT_SYSTEM_PROMPT if base is None else base
    tools = list(tools or [])
    if not tools:
        return text
    if all(isinstance(t, str) for t in tools):
        return f"{text}\nAvailable tools: {', '.join(str(t) for t in tools)}."
    return text + "\nAvailable tools:\n" + "\n".join(_tool_line(t) for t in tools)


# ----------------------------------------------------------------------------------------- hints

HINT_PREFIX = "[HINT] "
SOLUTION_PREFIX = "What worked here (the recorded next step): "


def with_hint(text: str, hint: str) -> str:
    return f"{text}{ACTION_SEP}{HINT_PREFIX}{hint}"


def with_solution(hint: str, solution: str, max_chars: int = 800) -> str:
    """``hint`` plus the recorded next step at the site: the privileged information OPSD's teacher gets
    (``loss.sdpo.on_policy.privileged: recovery``); the solution is cut at ``max_chars``."""
    return f"{hint}\n{SOLUTION_PREFIX}{solution[:max_chars]}"


def add_hint(messages: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with the hint right after the failure, before the answer: appended to the
    last message when it is user text, else (a ``tool`` result) as a user message of its own. The text
    format merges that message into the results before it, as its last paragraph."""
    msgs = [dict(m) for m in messages]
    if msgs and msgs[-1].get("role") == "user" and isinstance(msgs[-1].get("content"), str):
        msgs[-1]["content"] = with_hint(msgs[-1]["content"], hint)
    else:
        msgs.append({"role": "user", "content": f"{HINT_PREFIX}{hint}"})
    return msgs


# ----------------------------------------------------------------------------------------- turns


def _call_id(name: str, arguments: str, j: int) -> str:
    """A call id for a call the log gave none: stable (from the call itself), so renders agree."""
    return "call_" + hashlib.sha256(f"{name}\0{arguments}".encode()).hexdigest()[:12] + f"_{j}"


def openai_tool_call(name: str, args: Any, j: int = 0, call_id: str | None = None) -> dict[str, Any]:
    """One call as an OpenAI ``tool_calls`` entry (``arguments`` as JSON text)."""
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": call_id or _call_id(name, arguments, j), "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def _recorded_parts(content: str, calls: Sequence[Mapping[str, Any]]) -> tuple[str, list, str] | None:
    """The prose, calls and thinking of a recorded action whose calls ingestion listed (their ids kept):
    its blocks minus the tool lines and thinking blocks. None when a listed call has no line in ``content``."""
    pairs = []
    for c in calls:
        args = c.get("arguments", c.get("input"))
        pairs.append((str(c.get("name")), {} if args is None else args, c.get("id")))
    lines = {format_tool_use(n, a) for n, a, _ in pairs}
    parts = content.split(ACTION_SEP)
    if not lines <= set(parts):
        return None
    prose = ACTION_SEP.join(p for p in parts if p not in lines and not p.startswith(THINKING_TAG))
    thinking = ACTION_SEP.join(p[len(THINKING_TAG) :].strip() for p in parts if p.startswith(THINKING_TAG))
    return prose.strip(), pairs, thinking


def assistant_message(content: str, calls: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """An action as an OpenAI assistant message: its prose as ``content`` and its calls as
    ``tool_calls``. ``calls`` (``[{"name", "arguments", "id"?}]``, as ingestion records a turn's calls)
    are taken with their ids when ``content`` holds their tool lines; otherwise ``content`` is parsed
    (model output in either format, or action text). An answer without calls, or holding a malformed
    one, stays text (``content`` verbatim, no ``tool_calls``): the model sees what it wrote. The
    thinking blocks of an action with calls are not shown."""
    recorded = _recorded_parts(content, calls) if calls else None
    thinking = ""
    if recorded is not None:
        prose, pairs, thinking = recorded
    else:
        parsed = _parse(content)[0]
        if not parsed.ok or not parsed.tool_calls:  # prose stays as written
            return {"role": "assistant", "content": content}
        prose, pairs = parsed.text, [(n, a, None) for n, a in parsed.tool_calls]
    msg: dict[str, Any] = {"role": "assistant", "content": prose}
    if thinking:  # kept (ingested with strip_thinking off) as data; the templates here do not show it
        msg["reasoning_content"] = thinking
    if pairs:
        msg["tool_calls"] = [openai_tool_call(n, a, j, i) for j, (n, a, i) in enumerate(pairs)]
    return msg


def _answered_call(msgs: Sequence[Mapping[str, Any]], name: str) -> str:
    """The id of the call a tool result answers: the first unanswered call of that name (else the first
    unanswered call) of the last assistant message."""
    k = len(msgs) - 1
    while k >= 0 and msgs[k].get("role") == "tool":
        k -= 1
    answered = {m.get("tool_call_id") for m in msgs[k + 1 :]}
    calls = [c for c in (msgs[k].get("tool_calls") or []) if c["id"] not in answered] if k >= 0 else []
    named = [c for c in calls if c["function"]["name"] == name]
    pick = (named or calls or [None])[0]
    return pick["id"] if pick else _call_id(name, "", len(msgs))


def tool_message(
    name: str,
    content: str,
    is_error: bool,
    msgs: Sequence[Mapping[str, Any]] = (),
    call_id: str | None = None,
) -> dict[str, Any]:
    """A tool result as an OpenAI ``tool`` message, its error flag kept as ``is_error``."""
    return {"role": "tool", "tool_call_id": call_id or _answered_call(msgs, name), "name": name,
            "content": content, "is_error": is_error}  # fmt: skip


def append_turn(msgs: list[dict[str, Any]], turn: Mapping[str, Any]) -> int:
    """Append one ``TraceTurn`` to a message list; returns the index of the message that shows it.

    An assistant turn becomes an assistant message (:func:`assistant_message`, its ``tool_calls`` from
    the turn's recorded calls); a ``tool`` turn a ``tool`` message; user and harness-context turns merge
    into a preceding user message. The merged message is a new dict, so lists that share the old
    message objects (states emitted earlier) are not changed.
    """
    role = turn.get("role")
    if role == "assistant":
        calls = turn.get("tool_calls")
        msgs.append(
            assistant_message(str(turn.get("content") or ""), calls if isinstance(calls, list) else None)
        )
    elif role == "tool":
        name = turn.get("name") or (turn.get("error_meta") or {}).get("tool_name") or "tool"
        msgs.append(tool_message(str(name), str(turn.get("content") or ""), turn.get("tool_error") is not None,
                                 msgs, turn.get("tool_call_id")))  # fmt: skip
    else:
        text = str(turn.get("content") or "")
        if msgs and msgs[-1]["role"] == "user":
            msgs[-1] = {"role": "user", "content": msgs[-1]["content"] + ACTION_SEP + text}
        else:
            msgs.append({"role": "user", "content": text})
    return len(msgs) - 1


def turns_to_messages(
    turns: Sequence[Mapping[str, Any]], system_prompt: str | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """Chat messages for ``turns`` (after a system message when ``system_prompt`` is given) and, per
    turn, the index of the message that shows it."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return msgs, [append_turn(msgs, t) for t in turns]


def trace_tools(trace: Mapping[str, Any]) -> list[str]:
    """The tool names of a trace or state: its ``tools`` (the session's, written by ingestion), else the
    tools its assistant turns call (traces written before ``tools`` existed)."""
    if trace.get("tools") is not None:
        return tool_schemas.tool_names(trace["tools"])
    names = {c.get("name") for t in trace.get("turns") or [] for c in t.get("tool_calls") or []}
    names |= {(t.get("tool_call") or {}).get("name") for t in trace.get("turns") or []}
    return sorted(n for n in names if n)


def trace_tool_schemas(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tool schemas a trace or state is shown with: its ``tool_schemas`` (ingestion's, from the
    session's calls), else ``tool_schemas.tools_for`` of its source and tool names."""
    if trace.get("tool_schemas") is not None:
        return list(trace["tool_schemas"])
    return tool_schemas.tools_for(trace.get("source"), trace_tools(trace))


def trace_messages(
    trace: Mapping[str, Any], upto: int | None = None, *, system_prompt: str | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """A trace (``TraceExample``) as chat messages: the system message (:data:`SYSTEM_PROMPT`, or
    ``system_prompt``; "" for none), then ``turns[:upto]``. Render with :func:`trace_tool_schemas`."""
    turns = list(trace.get("turns") or [])[:upto]
    return turns_to_messages(turns, SYSTEM_PROMPT if system_prompt is None else (system_prompt or None))


# ----------------------------------------------------------------------------------------- sandbox tasks


def task_text(instruction: str, files: Mapping[str, str], *, max_chars: int = 3000) -> str:
    """The user message that opens a sandbox task: the instruction and the workspace files (their
    contents when all of them fit in ``max_chars``, else their names)."""
    names = sorted(files)
    if not names:
        return instruction
    if sum(len(files[n]) for n in names) > max_chars:
        return f"{instruction}\n\nFiles in the workspace: {', '.join(names)}."
    shown = "\n\n".join(f"--- {n} ---\n{files[n].rstrip()}" for n in names)
    return f"{instruction}\n\nFiles in the workspace:\n\n{shown}"


def task_messages(
    instruction: str, files: Mapping[str, str], tools: Iterable[Any] | None = None
) -> list[dict[str, Any]]:
    """The opening messages of a sandbox task (GRPO prompt and agent rollout alike). The tools are not
    in the messages: every render passes them to the chat template (``tools``, here unused)."""
    del tools
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task_text(instruction, files)},
    ]


# ----------------------------------------------------------------------------------------- text format


def _calls_of(m: Mapping[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        out.append((str(fn.get("name")), args))
    return out


# The roles the text format merges: a run of them becomes one user message (`text_messages`).
TEXT_MERGED_ROLES = ("tool", "user")


def text_messages(
    messages: Sequence[Mapping[str, Any]], tools: Iterable[str | Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The same conversation in the text format: ``{"role", "content"}`` only, the system message with
    the action format and the tools spelled out (:func:`system_text`), actions as tool lines, tool
    results as ``[TOOL_RESULT ...]`` text merged with neighbouring user text into one user message."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), str(m.get("content") or "")
        if role == "system" and i == 0:
            base = TEXT_SYSTEM_PROMPT if content == SYSTEM_PROMPT else content
            out.append({"role": "system", "content": system_text(tools, base=base)})
        elif role == "assistant":
            thinking = str(m.get("reasoning_content") or "")
            out.append({"role": "assistant", "content": action_text(content, _calls_of(m), thinking)})
        elif role in TEXT_MERGED_ROLES:
            text = (
                format_tool_result(str(m.get("name") or "tool"), content, bool(m.get("is_error")))
                if role == "tool"
                else content
            )
            if out and out[-1]["role"] == "user":
                out[-1] = {"role": "user", "content": out[-1]["content"] + ACTION_SEP + text}
            else:
                out.append({"role": "user", "content": text})
        else:
            out.append({"role": str(role), "content": content})
    return out


_PRIVATE_KEYS = ("is_error", "reasoning_content")


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as an OpenAI-compatible request or a dataset takes them: the project's own keys
    (``is_error``) dropped, ``None`` fields left out."""
    return [{k: v for k, v in m.items() if k not in _PRIVATE_KEYS and v is not None} for m in messages]
