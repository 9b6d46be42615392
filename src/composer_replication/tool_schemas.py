"""The tools a session's model can call, as OpenAI function-tool schemas: one table for every path.

Ingestion, training, evaluation, sandbox rollouts and teacher requests all show a model the same
schemas for a session (``tools=`` of the chat template, or of an OpenAI-compatible request), so the
model is trained in the context it is served in.

* :data:`CLAUDE_CODE_TOOLS` / :data:`CODEX_TOOLS`: name -> schema for the harnesses' built-in tools,
  with their real argument keys and JSON types (as the harnesses declare them and their session logs
  record them).
* :func:`infer_schema`: a schema for a tool no table knows (MCP tools, newer built-ins), from the inputs
  the session logged for it.
* :func:`tools_for`: the schemas of one session: its tools in order, a known tool's schema extended by
  any argument the log shows that the table lacks (so the schema never contradicts a logged call).
* :func:`input_problems`: how a logged or generated input disagrees with a schema, one line each.

A schema is ``{"type": "function", "function": {"name", "description", "parameters"}}`` with
``parameters`` a JSON-schema object (``properties``, ``required``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "CLAUDE_CODE_TOOLS",
    "CODEX_TOOLS",
    "infer_schema",
    "input_problems",
    "json_type",
    "known_schema",
    "tool_names",
    "tools_for",
]

Schema = dict[str, Any]


def _p(type_: str, description: str = "", **extra: Any) -> dict[str, Any]:
    return {"type": type_, **({"description": description} if description else {}), **extra}


def _tool(name: str, description: str, props: dict[str, dict[str, Any]], required: Sequence[str]) -> Schema:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(required)},
        },
    }


_STR_LIST = {"type": "array", "items": {"type": "string"}}
_TODO = {
    "type": "object",
    "properties": {
        "content": _p("string"),
        "status": _p("string", enum=["pending", "in_progress", "completed"]),
        "activeForm": _p("string"),
        "id": _p("string"),
        "priority": _p("string", enum=["high", "medium", "low"]),
    },
    "required": ["content", "status"],
}
_EDIT = {
    "type": "object",
    "properties": {"old_string": _p("string"), "new_string": _p("string"), "replace_all": _p("boolean")},
    "required": ["old_string", "new_string"],
}
_AGENT_PROPS = {
    "description": _p("string", "a short (3-5 word) description of the task"),
    "prompt": _p("string", "the task for the agent to perform"),
    "subagent_type": _p("string", "the type of specialised agent to use"),
    "model": _p("string"),
}

_CLAUDE_CODE = [
    _tool(
        "Bash",
        "Run a shell command in the workspace.",
        {
            "command": _p("string", "the command to execute"),
            "timeout": _p("number", "optional timeout in milliseconds"),
            "description": _p("string", "what the command does, in 5-10 words"),
            "run_in_background": _p("boolean"),
        },
        ["command"],
    ),
    _tool(
        "BashOutput",
        "Read the output of a background shell.",
        {"bash_id": _p("string"), "filter": _p("string")},
        ["bash_id"],
    ),
    _tool("KillShell", "Kill a background shell.", {"shell_id": _p("string")}, ["shell_id"]),
    _tool(
        "Read",
        "Read a file (lines numbered from 1).",
        {"file_path": _p("string", "the path of the file"), "offset": _p("number"), "limit": _p("number")},
        ["file_path"],
    ),
    _tool(
        "Write",
        "Create or overwrite a file.",
        {"file_path": _p("string", "the path of the file"), "content": _p("string", "the full new content")},
        ["file_path", "content"],
    ),
    _tool(
        "Edit",
        "Replace exact text in a file (old_string must occur once unless replace_all).",
        {
            "file_path": _p("string", "the path of the file"),
            "old_string": _p("string", "the text to replace"),
            "new_string": _p("string", "the replacement text"),
            "replace_all": _p("boolean", "replace every occurrence"),
        },
        ["file_path", "old_string", "new_string"],
    ),
    _tool(
        "MultiEdit",
        "Apply several edits to one file in order.",
        {"file_path": _p("string"), "edits": {"type": "array", "items": _EDIT}},
        ["file_path", "edits"],
    ),
    _tool(
        "Grep",
        "Search file contents with a regular expression (ripgrep).",
        {
            "pattern": _p("string", "the regular expression"),
            "path": _p("string"),
            "glob": _p("string"),
            "type": _p("string"),
            "output_mode": _p("string", enum=["content", "files_with_matches", "count"]),
            "-i": _p("boolean"),
            "-n": _p("boolean"),
            "-A": _p("number"),
            "-B": _p("number"),
            "-C": _p("number"),
            "multiline": _p("boolean"),
            "head_limit": _p("number"),
        },
        ["pattern"],
    ),
    _tool(
        "Glob", "Find files by glob pattern.", {"pattern": _p("string"), "path": _p("string")}, ["pattern"]
    ),
    _tool("LS", "List a directory.", {"path": _p("string"), "ignore": _STR_LIST}, ["path"]),
    _tool("TodoWrite", "Replace the todo list.", {"todos": {"type": "array", "items": _TODO}}, ["todos"]),
    _tool(
        "Task",
        "Launch a subagent for a task.",
        dict(_AGENT_PROPS),
        ["description", "subagent_type"],
    ),
    _tool(
        "Agent",
        "Launch a subagent for a task.",
        {**_AGENT_PROPS, "name": _p("string"), "isolation": _p("string"), "run_in_background": _p("boolean")},
        ["description", "prompt"],
    ),
    _tool(
        "WebFetch",
        "Fetch a URL and answer a prompt about it.",
        {"url": _p("string"), "prompt": _p("string")},
        ["url", "prompt"],
    ),
    _tool(
        "WebSearch",
        "Search the web.",
        {"query": _p("string"), "allowed_domains": _STR_LIST, "blocked_domains": _STR_LIST},
        ["query"],
    ),
    _tool(
        "NotebookEdit",
        "Replace, insert or delete a Jupyter notebook cell.",
        {
            "notebook_path": _p("string"),
            "new_source": _p("string"),
            "cell_id": _p("string"),
            "cell_type": _p("string", enum=["code", "markdown"]),
            "edit_mode": _p("string", enum=["replace", "insert", "delete"]),
        },
        ["notebook_path", "new_source"],
    ),
    _tool("ExitPlanMode", "Present the plan and leave plan mode.", {"plan": _p("string")}, ["plan"]),
    _tool("Skill", "Run a skill.", {"skill": _p("string"), "args": _p("string")}, ["skill"]),
]

_PLAN_STEP = {
    "type": "object",
    "properties": {
        "step": _p("string"),
        "status": _p("string", enum=["pending", "in_progress", "completed"]),
    },
    "required": ["step", "status"],
}
_CODEX = [
    _tool(
        "shell",
        "Run a command (argv list) in the workspace.",
        {
            "command": _STR_LIST,
            "workdir": _p("string"),
            "timeout_ms": _p("number"),
            "with_escalated_permissions": _p("boolean"),
            "justification": _p("string"),
        },
        ["command"],
    ),
    _tool(
        "exec_command",
        "Run a shell command line in a session.",
        {
            "cmd": _p("string"),
            "workdir": _p("string"),
            "shell": _p("string"),
            "login": _p("boolean"),
            "yield_time_ms": _p("number"),
            "max_output_tokens": _p("number"),
            "with_escalated_permissions": _p("boolean"),
            "justification": _p("string"),
        },
        ["cmd"],
    ),
    _tool(
        "write_stdin",
        "Write characters to a running exec session.",
        {
            "session_id": _p("number"),
            "chars": _p("string"),
            "yield_time_ms": _p("number"),
            "max_output_tokens": _p("number"),
        },
        ["session_id"],
    ),
    _tool(
        "apply_patch",
        "Apply a patch in the apply_patch format (*** Begin Patch ... *** End Patch).",
        {"input": _p("string", "the whole patch")},
        ["input"],
    ),
    _tool(
        "update_plan",
        "Update the task plan.",
        {"explanation": _p("string"), "plan": {"type": "array", "items": _PLAN_STEP}},
        ["plan"],
    ),
    _tool("local_shell", "Run a command (argv list).", {"command": _STR_LIST}, ["command"]),
    _tool("view_image", "Attach a local image.", {"path": _p("string")}, ["path"]),
    _tool("web_search", "Search the web.", {"query": _p("string")}, []),
]

CLAUDE_CODE_TOOLS: dict[str, Schema] = {t["function"]["name"]: t for t in _CLAUDE_CODE}
CODEX_TOOLS: dict[str, Schema] = {t["function"]["name"]: t for t in _CODEX}
_BY_SOURCE = {"claude_code": CLAUDE_CODE_TOOLS, "codex": CODEX_TOOLS}


# Python type of a decoded JSON value -> its JSON-schema type, checked in this order (a bool is an int).
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"),
    (str, "string"), (list, "array"), (Mapping, "object"),
)  # fmt: skip


def json_type(value: Any) -> str:
    """The JSON-schema type of a decoded JSON value (``"null"`` for anything else)."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "null")


def _infer_prop(values: list[Any]) -> dict[str, Any]:
    types = []
    for v in values:
        t = json_type(v)
        if t not in types:
            types.append(t)
    if set(types) == {"integer", "number"}:
        types = ["number"]
    prop: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    if types == ["array"]:
        items = [x for v in values for x in v]
        if items:
            prop["items"] = _infer_prop(items)
    return prop


def infer_schema(name: str, inputs: Iterable[Mapping[str, Any]]) -> Schema:
    """A schema for ``name`` from its logged inputs: every key seen (first-seen order) with the JSON
    type(s) of its values; keys present in every input are required. Non-object inputs are ignored."""
    seen: dict[str, list[Any]] = {}
    objs = [i for i in inputs if isinstance(i, Mapping)]
    for inp in objs:
        for k, v in inp.items():
            seen.setdefault(str(k), []).append(v)
    props = {k: _infer_prop(vs) for k, vs in seen.items()}
    required = [k for k in seen if all(k in i for i in objs)]
    return _tool(name, "", props, required)


def known_schema(name: str, source: str | None = None) -> Schema | None:
    """The table's schema for ``name``: the source's harness first, then the other's; None if unknown."""
    tables = [_BY_SOURCE[source]] if source in _BY_SOURCE else []
    tables += [t for t in (CLAUDE_CODE_TOOLS, CODEX_TOOLS) if t not in tables]
    for table in tables:
        if name in table:
            return copy.deepcopy(table[name])
    return None


def _type_ok(expected: Any, value: Any) -> bool:
    allowed = expected if isinstance(expected, list) else [expected]
    actual = json_type(value)
    return actual in allowed or (actual == "integer" and "number" in allowed)


def input_problems(schema: Mapping[str, Any], args: Any) -> list[str]:
    """How ``args`` disagrees with ``schema``, one short line each (empty when it fits): not an object,
    a missing required key, a key the schema lacks, a value of another JSON type."""
    fn = schema.get("function", schema)
    name = fn.get("name", "?")
    if not isinstance(args, Mapping):
        return [f"{name}: arguments must be a JSON object, got {json_type(args)}"]
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    out = [f"{name}: missing required argument {k!r}" for k in params.get("required") or [] if k not in args]
    for k, v in args.items():
        if k not in props:
            out.append(f"{name}: unknown argument {k!r}")
        elif "type" in props[k] and not _type_ok(props[k]["type"], v):
            out.append(f"{name}: argument {k!r} should be {props[k]['type']}, got {json_type(v)}")
    return out


def _extend(schema: Schema, inputs: list[Mapping[str, Any]]) -> Schema:
    """``schema`` with the keys the logged inputs use but it lacks (types inferred, never required)."""
    props = schema["function"]["parameters"]["properties"]
    extra = infer_schema(schema["function"]["name"], inputs)["function"]["parameters"]["properties"]
    for k, prop in extra.items():
        props.setdefault(k, prop)
    return schema


def tools_for(source: str | None, calls_seen: Mapping[str, Iterable[Any]] | Iterable[str]) -> list[Schema]:
    """The schemas of one session's tools, in the order given.

    ``calls_seen`` maps each tool name to the inputs the session logged for it, or is just the tool
    names (known tools then get the table's schema, unknown ones an argument-less schema). A known
    tool's schema gains the argument keys its logged inputs use and the table lacks; an unknown tool's
    schema is inferred from its inputs (:func:`infer_schema`). Deterministic: the same names and
    inputs give the same schemas.
    """
    items = calls_seen.items() if isinstance(calls_seen, Mapping) else ((n, ()) for n in calls_seen)
    out = []
    for name, inputs in items:
        objs = [i for i in inputs if isinstance(i, Mapping)]
        base = known_schema(str(name), source)
        out.append(_extend(base, objs) if base is not None else infer_schema(str(name), objs))
    return out


def tool_names(tools: Iterable[str | Mapping[str, Any]]) -> list[str]:
    """Tool names from names or schemas (either form, as traces and configs carry them)."""
    out = []
    for t in tools:
        if isinstance(t, Mapping):
            out.append(str(t.get("function", t).get("name", "")))
        else:
            out.append(str(t))
    return out
