"""Actions: the project's action text, what models emit (Hermes ``<tool_call>`` JSON, or the text
format's tool lines), OpenAI ``tool_calls``, all parsed into one :class:`ParsedAction`, canonicalised and
scored. See the package docstring for the format."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_USE_TAG = "[TOOL_USE]"
THINKING_TAG = "[THINKING]"
ACTION_SEP = "\n\n"  # between the blocks of one action, and between merged user-side turns
ACTION_FORMAT = "[TOOL_USE] name=<tool name> input=<JSON object of arguments>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOL_CALLS = 64  # more calls in one answer is runaway generation: booked as malformed
_MAX_NAME = 128

_TOOL_RE = re.compile(r"^\s*\[TOOL_USE\]\s+name=(\S+)\s+input=(.*)$")
_HERMES_RE = re.compile(r"(?:```[\w-]*\s*)?<tool_call>(.*?)(?:</tool_call>(?:\s*```)?|\Z)", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
_NAME_RE = re.compile(r"[^\s<>\"']{1," + str(_MAX_NAME) + "}")
_WS = re.compile(r"\s+")
_EMPTY_FENCE = re.compile(r"```[\w-]*\s*```")  # a fence left empty once the tool lines inside are taken out

CanonicalAction = tuple[tuple[str, str], ...] | str


@dataclass(frozen=True)
class ParsedAction:
    """An action split into its parts. ``errors`` holds one line per malformed tool call."""

    text: str
    tool_calls: tuple[tuple[str, Any], ...] = ()
    errors: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.errors


# ``json.dumps(args, ensure_ascii=False)``'s encoder, built once (dumps builds one per call with those options).
_encode_args = json.JSONEncoder(ensure_ascii=False).encode


def format_tool_use(name: str, args: Any) -> str:
    """One tool call as its text-format line (the JSON on one line: newlines inside strings are escaped)."""
    return f"{TOOL_USE_TAG} name={name} input={_encode_args(args)}"


def format_thinking(text: str) -> str:
    return f"{THINKING_TAG} {text}"


def action_text(prose: str, calls: Iterable[tuple[str, Any]], thinking: str = "") -> str:
    """The project's action text (``student_action``, teacher ``response_text``) for parsed parts:
    thinking, prose, then one tool line per call, separated by a blank line."""
    parts = [format_thinking(thinking)] if thinking.strip() else []
    parts += [prose] if prose.strip() else []
    parts += [format_tool_use(n, a) for n, a in calls]
    return ACTION_SEP.join(parts)


def _strip_fences(text: str) -> str:
    # Chat models like wrapping the answer in ```...```; the fence lines carry no action.
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("```"))


def _scan(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Text-format lines: (prose lines, [(tool name, raw input)]) in order; thinking blocks dropped."""
    prose: list[str] = []
    calls: list[tuple[str, str]] = []
    in_thinking = False
    for line in text.splitlines():
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


def _hermes_call(body: str) -> tuple[str, Any] | str:
    """``(name, arguments)`` of one ``<tool_call>`` body, or the reason it is malformed."""
    body = _strip_fences(body).strip()
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg})"
    if body[end:].strip():
        return "text after the JSON object"
    if not isinstance(obj, dict):
        return f"must be a JSON object, got {type(obj).__name__}"
    inner = obj.get("function")
    fn: dict[str, Any] = inner if isinstance(inner, dict) else obj  # OpenAI-shaped drift
    name = fn.get("name")
    args = fn.get("arguments", fn.get("parameters", {}))
    return _checked(name, args)


def _checked(name: Any, args: Any) -> tuple[str, Any] | str:
    if not isinstance(name, str) or not name.strip():
        return "empty tool name"
    if not _NAME_RE.fullmatch(name.strip()):
        return f"bad tool name {name[:40]!r}"
    if isinstance(args, str):  # OpenAI sends arguments as JSON text
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return f"{name.strip()}: arguments are not valid JSON ({e.msg})"
    if not isinstance(args, dict):
        return f"{name.strip()}: arguments must be a JSON object, got {type(args).__name__}"
    return name.strip(), args


def _collect(
    found: Iterable[tuple[str, Any] | str], prose: str
) -> tuple[ParsedAction, list[tuple[str, Any] | str]]:
    items = list(found)
    calls = [c for c in items if not isinstance(c, str)]
    errors = [f"tool call {i + 1}: {c}" for i, c in enumerate(items) if isinstance(c, str)]
    if len(items) > MAX_TOOL_CALLS:
        errors.insert(0, f"{len(items)} tool calls in one answer (at most {MAX_TOOL_CALLS})")
    return ParsedAction(prose, tuple(calls[:MAX_TOOL_CALLS]), tuple(errors[:8])), items


def _parse(text: str) -> tuple[ParsedAction, list[tuple[str, Any] | str]]:
    """Both formats: Hermes ``<tool_call>`` blocks (a code fence around one and a missing closing tag
    at the end are tolerated) and text-format tool lines, in order of appearance; thinking dropped."""
    text = _THINK_RE.sub("", text)
    found: list[tuple[int, tuple[str, Any] | str]] = []
    rest = []
    pos = 0
    for m in _HERMES_RE.finditer(text):
        rest.append(text[pos : m.start()])
        pos = m.end()
        found.append((m.start(), _hermes_call(m.group(1))))
    rest.append(text[pos:])
    prose_lines: list[str] = []
    for chunk in rest:
        lines, raw = _scan(chunk)
        prose_lines += lines
        for name, inp in raw:
            try:
                found.append((len(text), _checked(name, json.loads(inp))))
            except json.JSONDecodeError as e:
                found.append((len(text), f"tool {name}: input is not valid JSON ({e.msg})"))
    found.sort(key=lambda x: x[0])  # Hermes first by position; text lines after (one format per answer)
    return _collect((c for _, c in found), _EMPTY_FENCE.sub("", "\n".join(prose_lines)).strip())


def parse_action(text: str | None) -> ParsedAction:
    """Parse an action (model output in either format, or recorded action text) into prose and tool
    calls; each malformed call (arguments not a JSON object, empty or bad name, too many calls) is one
    line in ``errors``."""
    if text is None:
        return ParsedAction(text="", errors=("no response",))
    return _parse(text)[0]


def parse_openai_message(message: Mapping[str, Any] | None) -> ParsedAction:
    """An OpenAI-style assistant message (``content`` + ``tool_calls`` with JSON-text ``arguments``), as
    a server or a teacher returns it: the same :class:`ParsedAction` its text would parse to. Content
    holding Hermes or text-format calls (a server without a tool parser) is parsed too."""
    if not message:
        return ParsedAction(text="", errors=("no response",))
    content = message.get("content")
    base, items = _parse(content if isinstance(content, str) else "")
    calls: list[tuple[str, Any] | str] = []
    raw_calls = message.get("tool_calls") or []
    for c in raw_calls if isinstance(raw_calls, list) else [raw_calls]:
        fn = c.get("function", c) if isinstance(c, Mapping) else {}
        calls.append(
            _checked(fn.get("name"), fn.get("arguments", {})) if isinstance(fn, Mapping) else "not an object"
        )
    return _collect([*calls, *items], base.text)[0]


def tool_calls(text: str) -> list[dict[str, Any]]:
    """The tool calls of an action, in order, as ``{"name", "input"}`` (what a sandbox executes).

    A malformed call becomes ``{"name": "_invalid", "input": {"raw", "error"}}`` in its place, so the
    agent gets a tool error back instead of silence; past :data:`MAX_TOOL_CALLS` one ``_invalid`` entry
    stands for the rest.
    """
    items = _parse(text)[1]
    out: list[dict[str, Any]] = []
    for i, c in enumerate(items[:MAX_TOOL_CALLS]):
        if isinstance(c, str):
            out.append({"name": "_invalid", "input": {"raw": text[:500], "error": f"tool call {i + 1}: {c}"}})
        else:
            out.append({"name": c[0], "input": c[1]})
    if len(items) > MAX_TOOL_CALLS:
        error = f"{len(items)} tool calls in one answer (at most {MAX_TOOL_CALLS})"
        out.append({"name": "_invalid", "input": {"raw": "", "error": error}})
    return out


def _canonical(parsed: ParsedAction) -> CanonicalAction | None:
    if not parsed.ok:
        return None
    if parsed.tool_calls:
        return tuple(
            (name, json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
            for name, args in parsed.tool_calls
        )
    collapsed = _WS.sub(" ", _strip_fences(parsed.text)).strip()
    return collapsed or None


def canonical_action(text: str | None) -> CanonicalAction | None:
    """The canonical form of an action, or None when it is empty or malformed."""
    return _canonical(parse_action(text))


def score_action(output: str, state: Mapping[str, Any], *, complete: bool = True) -> dict[str, Any]:
    """Score an answer against the action ``state["student_action"]`` recorded at that state:
    ``well_formed`` (it parses, and names only the session's tools when ``state["tools"]`` lists them),
    ``valid`` (well-formed and ``complete``: the answer ended before the generation budget; an answer
    cut by the budget, prose or call, is no action a harness can take), ``has_tool_call`` (a valid
    answer holding a tool call), ``tool_match`` (valid, with the same tool names in order) and ``exact``
    (valid, the same canonical action). ``error`` is the first reason an answer is malformed (one line),
    else None. Evaluation and the site metrics score answers with it."""
    parsed = parse_action(output)
    canon = _canonical(parsed)
    tools = _names(state.get("tools") or [])
    unknown = [n for n, _ in parsed.tool_calls if tools and n not in tools]
    well_formed = parsed.ok and canon is not None and not unknown
    valid = well_formed and complete
    ref = parse_action(state["student_action"])
    names = [n for n, _ in parsed.tool_calls]
    ref_names = [n for n, _ in ref.tool_calls]
    error = parsed.errors[0] if parsed.errors else (f"unknown tool {unknown[0]!r}" if unknown else None)
    return {
        "well_formed": bool(well_formed),
        "valid": bool(valid),
        "has_tool_call": bool(valid and parsed.tool_calls),
        "tool_match": bool(valid and names == ref_names and bool(ref_names)),
        "exact": bool(valid and canon == _canonical(ref)),
        "error": error,
    }


def _names(tools: Sequence[Any]) -> list[str]:
    return [str(t.get("function", t).get("name")) if isinstance(t, Mapping) else str(t) for t in tools]


def render_canonical(action: CanonicalAction) -> str:
    """Canonical action back to action text (tool lines, or the collapsed text)."""
    if isinstance(action, str):
        return action
    return ACTION_SEP.join(f"{TOOL_USE_TAG} name={name} input={args}" for name, args in action)


# ----------------------------------------------------------------------------------------- tool results

_RESULT_RE = re.compile(r"^\[TOOL_RESULT name=(\S*) is_error=(true|false)\]$")


def format_tool_result(name: str, content: str, is_error: bool) -> str:
    """A tool result in the text format (a user message)."""
    return f"[TOOL_RESULT name={name} is_error={'true' if is_error else 'false'}]\n{content}"


def parse_tool_result_head(text: str) -> tuple[str, bool] | None:
    """``(tool name, is_error)`` when ``text`` starts with a text-format tool-result header, else None."""
    m = _RESULT_RE.match(text.split("\n", 1)[0])
    return (m.group(1), m.group(2) == "true") if m else None
