"""The one wire format: how a coding-agent trace is written as chat text for a model.

Every path that shows a trace to a model renders it here, so that the model is trained in exactly the
context it is evaluated and rolled out in: ingestion (the ``messages`` of states), the offline collator,
GRPO prompts (trace rows and sandbox task rows), teacher replay, evaluation and sandbox rollouts.

* **Action** (an assistant turn): its content blocks in order, separated by a blank line. Text is
  itself; a tool call is one line ``[TOOL_USE] name=<tool> input=<json>`` (:func:`format_tool_use`);
  a thinking block is ``[THINKING] <text>``. :func:`parse_action` reads it back.
* **Tool result**: a user message ``[TOOL_RESULT name=<tool> is_error=<true|false>]`` + newline + the
  output (:func:`format_tool_result`). Consecutive user-side turns (results, user text) are merged into
  one user message, separated by a blank line, so roles alternate for strict chat templates.
* **Hint** (the SDPO teacher's context): ``[HINT] <text>`` appended, after a blank line, to the last
  user message before the assistant turn (:func:`add_hint`).
* **System message**: :data:`SYSTEM_PROMPT` (the action format) plus the available tools
  (:func:`system_text`). Ingestion writes it as ``messages[0]`` of every state; traces carry the tools
  (``tools``) and :func:`trace_messages` adds the same message in front of their turns.

Action text: two actions agree iff their canonical forms are equal: the tuple of
``(name, json.dumps(input, sort_keys=True, separators=(",", ":")))`` when there are tool calls,
otherwise the text with whitespace collapsed; thinking is ignored. Real model output drifts (code
fences, prose around the tool line): :func:`parse_action` accepts a tool line anywhere in the text and
rejects a tool line whose JSON does not parse, so a malformed response never agrees with anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ACTION_FORMAT",
    "CanonicalAction",
    "HINT_PREFIX",
    "ParsedAction",
    "SYSTEM_PROMPT",
    "add_hint",
    "append_turn",
    "canonical_action",
    "fit_messages",
    "format_thinking",
    "format_tool_result",
    "format_tool_use",
    "parse_action",
    "parse_tool_result_head",
    "render_canonical",
    "score_action",
    "system_text",
    "task_messages",
    "task_text",
    "tool_calls",
    "trace_messages",
    "trace_tools",
    "turns_to_messages",
    "with_hint",
]

# ----------------------------------------------------------------------------------------- action text

TOOL_USE_TAG = "[TOOL_USE]"
THINKING_TAG = "[THINKING]"
ACTION_SEP = "\n\n"  # between the blocks of one action, and between merged user-side turns
ACTION_FORMAT = "[TOOL_USE] name=<tool name> input=<JSON object of arguments>"

_TOOL_RE = re.compile(r"^\s*\[TOOL_USE\]\s+name=(\S+)\s+input=(.*)$")
_WS = re.compile(r"\s+")

CanonicalAction = tuple[tuple[str, str], ...] | str


@dataclass(frozen=True)
class ParsedAction:
    """An action split into its parts. ``errors`` lists tool lines that could not be parsed."""

    text: str
    tool_calls: tuple[tuple[str, Any], ...] = ()
    errors: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.errors


def format_tool_use(name: str, args: Any) -> str:
    """One tool call as its action line (the JSON on one line: newlines inside strings are escaped)."""
    return f"{TOOL_USE_TAG} name={name} input={_encode_args(args)}"


# ``json.dumps(args, ensure_ascii=False)``'s encoder, built once (dumps builds one per call with those options).
_encode_args = json.JSONEncoder(ensure_ascii=False).encode


def format_thinking(text: str) -> str:
    return f"{THINKING_TAG} {text}"


def _strip_fences(text: str) -> str:
    # Chat models like wrapping the answer in ```...```; the fence lines carry no action.
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("```"))


def _scan(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(prose lines, [(tool name, raw input)]) in order; thinking blocks dropped."""
    prose: list[str] = []
    calls: list[tuple[str, str]] = []
    in_thinking = False
    for line in _strip_fences(text).splitlines():
        m = _TOOL_RE.match(line)
        if m:
            in_thinking = False
            calls.append((m.group(1), m.group(2).strip()))
            continue
        if line.lstrip().startswith(THINKING_TAG):
            in_thinking = True  # a thinking block runs until the next blank line
            continue
        if in_thinking:
            if not line.strip():
                in_thinking = False
            continue
        prose.append(line)
    return prose, calls


def parse_action(text: str | None) -> ParsedAction:
    """Parse action text into prose and tool calls (thinking blocks dropped)."""
    if text is None:
        return ParsedAction(text="", errors=("no response",))
    prose, raw_calls = _scan(text)
    calls: list[tuple[str, Any]] = []
    errors: list[str] = []
    for name, raw in raw_calls:
        try:
            calls.append((name, json.loads(raw)))
        except json.JSONDecodeError as exc:
            errors.append(f"tool {name}: input is not valid JSON ({exc.msg})")
    return ParsedAction(text="\n".join(prose).strip(), tool_calls=tuple(calls), errors=tuple(errors))


def tool_calls(text: str) -> list[dict[str, Any]]:
    """The tool calls of an action, in order, as ``{"name", "input"}`` (what a sandbox executes).

    A tool line whose input is not a JSON object becomes ``{"name": "_invalid", "input": {"raw",
    "error"}}`` in its place, so the agent gets a tool error back instead of silence.
    """
    out: list[dict[str, Any]] = []
    for name, raw in _scan(text)[1]:
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as e:
            error = f"{name}: input is not valid JSON ({e.msg})"
        else:
            if isinstance(args, dict):
                out.append({"name": name, "input": args})
                continue
            error = f"{name}: input must be a JSON object, got {type(args).__name__}"
        out.append({"name": "_invalid", "input": {"raw": raw[:500], "error": error}})
    return out


def canonical_action(text: str | None) -> CanonicalAction | None:
    """The canonical form of an action, or None when it is empty or malformed."""
    parsed = parse_action(text)
    if not parsed.ok:
        return None
    if parsed.tool_calls:
        return tuple(
            (name, json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            for name, args in parsed.tool_calls
        )
    collapsed = _WS.sub(" ", parsed.text).strip()
    return collapsed or None


def score_action(output: str, state: dict[str, Any], *, complete: bool = True) -> dict[str, Any]:
    """Score an answer against the action ``state["student_action"]`` recorded at that state:
    ``well_formed`` (it parses, and names only the session's tools when ``state["tools"]`` lists them),
    ``valid`` (well-formed and ``complete``: the answer ended before the generation budget; an answer
    cut by the budget, prose or call, is no action a harness can take), ``has_tool_call`` (a valid
    answer holding a tool call), ``tool_match`` (valid, with the same tool names in order) and ``exact``
    (valid, the same canonical action). Evaluation and the site metrics score answers with it."""
    parsed = parse_action(output)
    canon = canonical_action(output)
    tools = state.get("tools") or []
    known_tools = all(name in tools for name, _ in parsed.tool_calls) if tools else True
    well_formed = parsed.ok and canon is not None and known_tools
    valid = well_formed and complete
    ref = parse_action(state["student_action"])
    ref_canon = canonical_action(state["student_action"])
    names = [n for n, _ in parsed.tool_calls]
    ref_names = [n for n, _ in ref.tool_calls]
    return {
        "well_formed": bool(well_formed),
        "valid": bool(valid),
        "has_tool_call": bool(valid and parsed.tool_calls),
        "tool_match": bool(valid and names == ref_names and bool(ref_names)),
        "exact": bool(valid and canon == ref_canon),
    }


def render_canonical(action: CanonicalAction) -> str:
    """Canonical action back to action text (tool lines, or the collapsed text)."""
    if isinstance(action, str):
        return action
    return ACTION_SEP.join(f"{TOOL_USE_TAG} name={name} input={args}" for name, args in action)


# ----------------------------------------------------------------------------------------- tool results

_RESULT_RE = re.compile(r"^\[TOOL_RESULT name=(\S*) is_error=(true|false)\]$")


def format_tool_result(name: str, content: str, is_error: bool) -> str:
    return f"[TOOL_RESULT name={name} is_error={'true' if is_error else 'false'}]\n{content}"


def parse_tool_result_head(text: str) -> tuple[str, bool] | None:
    """``(tool name, is_error)`` when ``text`` starts with a tool-result header, else None."""
    m = _RESULT_RE.match(text.split("\n", 1)[0])
    return (m.group(1), m.group(2) == "true") if m else None


# ----------------------------------------------------------------------------------------- hints

HINT_PREFIX = "[HINT] "


def with_hint(text: str, hint: str) -> str:
    return f"{text}{ACTION_SEP}{HINT_PREFIX}{hint}"


SOLUTION_PREFIX = "What worked here (the recorded next step): "


def with_solution(hint: str, solution: str, max_chars: int = 800) -> str:
    """``hint`` plus the recorded next step at the site: the privileged information OPSD's teacher gets
    (``loss.sdpo.on_policy.privileged: recovery``); the solution is cut at ``max_chars``."""
    return f"{hint}\n{SOLUTION_PREFIX}{solution[:max_chars]}"


def add_hint(messages: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A copy of ``messages`` with the hint appended to the last user message (a new one if none)."""
    msgs = [dict(m) for m in messages]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last is None or not isinstance(msgs[last].get("content"), str):
        msgs.append({"role": "user", "content": f"{HINT_PREFIX}{hint}"})
    else:
        msgs[last]["content"] = with_hint(msgs[last]["content"], hint)
    return msgs


# ----------------------------------------------------------------------------------------- system

SYSTEM_PROMPT = (
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
    """The system message: ``base`` (default :data:`SYSTEM_PROMPT`) and the available tools.

    ``tools`` are names (``"Bash"``, as ingestion records them) or OpenAI-style function schemas
    (``datagen.tools.TOOL_SCHEMAS``: each tool is then listed with its arguments).
    """
    text = SYSTEM_PROMPT if base is None else base
    tools = list(tools or [])
    if not tools:
        return text
    if all(isinstance(t, str) for t in tools):
        return f"{text}\nAvailable tools: {', '.join(str(t) for t in tools)}."
    return text + "\nAvailable tools:\n" + "\n".join(_tool_line(t) for t in tools)


# ----------------------------------------------------------------------------------------- turns


def _tool_turn_text(turn: Mapping[str, Any]) -> str:
    name = turn.get("name") or (turn.get("error_meta") or {}).get("tool_name") or "tool"
    return format_tool_result(str(name), str(turn.get("content") or ""), turn.get("tool_error") is not None)


def append_turn(msgs: list[dict[str, Any]], turn: Mapping[str, Any]) -> int:
    """Append one ``TraceTurn`` to a message list; returns the index of the message that shows it.

    An assistant turn's message is its ``content`` (the action text, tool lines included; ``tool_call``
    is metadata). A ``tool`` turn is rendered as a tool result; user-side turns merge into a preceding
    user message. The merged message is a new dict, so lists that share the old message objects (states
    emitted earlier) are not changed.
    """
    role = turn.get("role")
    if role == "assistant":
        msgs.append({"role": "assistant", "content": str(turn.get("content") or "")})
    else:
        text = _tool_turn_text(turn) if role == "tool" else str(turn.get("content") or "")
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
    """The tools of a trace: its ``tools`` (the session's, written by ingestion), else the tools its
    assistant turns call (traces written before ``tools`` existed)."""
    if trace.get("tools") is not None:
        return list(trace["tools"])
    names = {c.get("name") for t in trace.get("turns") or [] for c in t.get("tool_calls") or []}
    names |= {(t.get("tool_call") or {}).get("name") for t in trace.get("turns") or []}
    return sorted(n for n in names if n)


def trace_messages(
    trace: Mapping[str, Any], upto: int | None = None, *, system_prompt: str | None = None
) -> tuple[list[dict[str, Any]], list[int]]:
    """A trace (``TraceExample``) as chat messages: the system message with the trace's tools, then
    ``turns[:upto]``. ``system_prompt`` replaces the system message ("" for none)."""
    turns = list(trace.get("turns") or [])[:upto]
    system = system_text(trace_tools(trace)) if system_prompt is None else system_prompt
    return turns_to_messages(turns, system or None)


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
    instruction: str, files: Mapping[str, str], tools: Iterable[str | Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The opening messages of a sandbox task (GRPO prompt and agent rollout alike)."""
    msgs, _ = turns_to_messages(
        [{"role": "user", "content": task_text(instruction, files)}], system_text(tools)
    )
    return msgs


# ----------------------------------------------------------------------------------------- prompt length


def _render_ids(tok: Any, msgs: list[dict[str, Any]]) -> list[int]:
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def fit_messages(tok: Any, messages: Sequence[Mapping[str, Any]], max_len: int) -> list[dict[str, Any]]:
    """Drop the oldest messages (a leading system message stays) until the prompt (with the generation
    prompt) fits ``max_len`` tokens; a last message still over the cap keeps the end of its text.

    Used for every prompt a model answers (GRPO rows, evaluation), like the collator's truncation of
    training rows: whole messages go first, the system message never.
    """
    msgs = [dict(m) for m in messages]
    keep_first = 1 if msgs and msgs[0].get("role") == "system" else 0
    # Estimate from per-message token counts (one tokenizer call each), then verify by rendering:
    # re-rendering the whole history per dropped message is quadratic on long agent sessions.
    sizes = [len(tok(str(m.get("content", "")), add_special_tokens=False)["input_ids"]) + 8 for m in msgs]
    budget, start = max_len - sum(sizes[:keep_first]), len(msgs)
    while start > keep_first and budget - sizes[start - 1] >= 0:
        start -= 1
        budget -= sizes[start]
    msgs = msgs[:keep_first] + msgs[min(start, len(msgs) - 1) :]
    while len(_render_ids(tok, msgs)) > max_len and len(msgs) > keep_first + 1:
        del msgs[keep_first]
    while len(_render_ids(tok, msgs)) > max_len and len(msgs[-1]["content"]) > 16:
        msgs[-1]["content"] = msgs[-1]["content"][len(msgs[-1]["content"]) // 4 :]
    return msgs
