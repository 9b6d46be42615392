"""The tool schemas: the harness tables fit what the bundled real sessions logged, unknown tools get a
schema inferred from their inputs, and a session's schemas never contradict its own calls."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from composer_replication import tool_schemas as ts

SESSIONS = [
    Path(__file__).parents[1] / "data" / "sessions",
    Path(__file__).parents[2]
    / "src"
    / "composer_replication"
    / "data",  # the bundled demo and learning sessions
]


def _logged_calls() -> dict[tuple[str, str], list[dict]]:
    """(source, tool) -> the inputs the bundled Claude Code and Codex logs record (parsed JSON only)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in (p for d in SESSIONS for p in d.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "assistant":
                for b in (rec.get("message") or {}).get("content") or []:
                    if isinstance(b, dict) and b.get("type") == "tool_use":
                        out[("claude_code", b["name"])].append(b.get("input") or {})
            p = rec.get("payload") or {}
            if rec.get("type") == "response_item" and p.get("type") == "function_call":
                try:
                    args = json.loads(p.get("arguments") or "")
                except ValueError:
                    continue  # the redacted arguments of the bundled logs
                out[("codex", p["name"])].append(args)
            if rec.get("type") == "response_item" and p.get("type") == "custom_tool_call":
                out[("codex", p["name"])].append({"input": p.get("input")})
    return out


# Keys the bundled logs use that today's tool tables no longer declare (older CLI versions).
_OLDER_KEYS = {("Grep", "include")}


def test_tables_fit_the_logged_inputs_of_known_tools():
    calls = _logged_calls()
    checked = 0
    for (source, name), inputs in calls.items():
        table = ts.CLAUDE_CODE_TOOLS if source == "claude_code" else ts.CODEX_TOOLS
        if name not in table:
            continue
        for args in inputs:
            problems = [
                p
                for p in ts.input_problems(table[name], args)
                if not any(f"'{k}'" in p for _, k in _OLDER_KEYS)
            ]
            assert not problems, (source, name, args, problems)
            checked += 1
    assert checked > 700
    # the real names the issue asks for are all there
    assert {"Bash", "Read", "Write", "Edit", "MultiEdit", "Grep", "Glob", "LS", "TodoWrite"} <= set(
        ts.CLAUDE_CODE_TOOLS
    )
    assert {"Task", "Agent", "WebFetch", "WebSearch", "NotebookEdit"} <= set(ts.CLAUDE_CODE_TOOLS)
    assert {"shell", "apply_patch", "update_plan"} <= set(ts.CODEX_TOOLS)


def test_infer_schema_types_and_required_keys():
    s = ts.infer_schema(
        "mcp__db__query",
        [{"sql": "select 1", "limit": 5, "flags": ["a"]}, {"sql": "x", "limit": 2.5}, "not an object"],
    )
    fn = s["function"]
    assert s["type"] == "function" and fn["name"] == "mcp__db__query"
    props = fn["parameters"]["properties"]
    assert props["sql"] == {"type": "string"}
    assert props["limit"] == {"type": "number"}  # int and float: number
    assert props["flags"] == {"type": "array", "items": {"type": "string"}}
    assert fn["parameters"]["required"] == ["sql", "limit"]
    assert list(props) == ["sql", "limit", "flags"]  # first-seen order: deterministic
    mixed = ts.infer_schema("t", [{"x": 1}, {"x": "a"}])["function"]["parameters"]["properties"]["x"]
    assert mixed == {"type": ["integer", "string"]}


def test_tools_for_extends_known_schemas_and_infers_unknown_ones():
    calls = _logged_calls()
    grep_inputs = calls[("claude_code", "Grep")]
    tools = ts.tools_for(
        "claude_code", {"Bash": [{"command": "ls"}], "Grep": grep_inputs, "Mystery": [{"q": 1}]}
    )
    assert [t["function"]["name"] for t in tools] == ["Bash", "Grep", "Mystery"]
    grep = tools[1]
    assert "include" in grep["function"]["parameters"]["properties"]  # an older key the log uses
    assert (
        "include" not in ts.CLAUDE_CODE_TOOLS["Grep"]["function"]["parameters"]["properties"]
    )  # table intact
    assert all(not ts.input_problems(grep, a) for a in grep_inputs)
    assert tools[2]["function"]["parameters"]["properties"] == {"q": {"type": "integer"}}
    # names only: the table's schemas, an argument-less one for a tool nobody knows
    by_name = ts.tools_for("codex", ["shell", "apply_patch", "Bash", "zzz"])
    assert by_name[0] == ts.CODEX_TOOLS["shell"] and by_name[2] == ts.CLAUDE_CODE_TOOLS["Bash"]
    assert by_name[3]["function"]["parameters"] == {"type": "object", "properties": {}, "required": []}
    assert ts.tools_for("codex", ["shell"]) == ts.tools_for("codex", ["shell"])
    assert ts.tool_names(by_name) == ["shell", "apply_patch", "Bash", "zzz"]


def test_input_problems_one_line_each():
    bash = ts.CLAUDE_CODE_TOOLS["Bash"]
    assert ts.input_problems(bash, {"command": "ls", "timeout": 5}) == []
    assert ts.input_problems(bash, ["ls"]) == ["Bash: arguments must be a JSON object, got array"]
    got = ts.input_problems(bash, {"timeout": "soon", "cwd": "/"})
    assert got == [
        "Bash: missing required argument 'command'",
        "Bash: argument 'timeout' should be number, got string",
        "Bash: unknown argument 'cwd'",
    ]


def test_sandbox_tools_use_the_table():
    from composer_replication.datagen.tools import TOOL_SCHEMAS

    assert TOOL_SCHEMAS == [ts.CLAUDE_CODE_TOOLS[n] for n in ("Bash", "Read", "Write", "Edit")]


def test_ingestion_writes_the_sessions_schemas_and_books_inputs_off_them(tmp_path):
    """Traces carry their session's schemas; logged inputs a schema disagrees with (the bundled Codex logs
    redact their arguments, so ``exec_command`` has no ``cmd``) are counted under one line each."""
    from composer_replication.ingestion import ingest_paths, read_examples

    res = ingest_paths([SESSIONS[0] / "codex"], tmp_path / "out")
    t = res["totals"]
    assert t["n_schema_mismatches"] > 0
    assert t["schema_mismatches"]["codex exec_command: missing required argument 'cmd'"] > 0
    assert all("\n" not in k and k.startswith("codex ") for k in t["schema_mismatches"])
    for ex in read_examples(tmp_path / "out" / "traces.jsonl"):
        assert [s["function"]["name"] for s in ex["tool_schemas"]] == ex["tools"]
        shell = next((s for s in ex["tool_schemas"] if s["function"]["name"] == "shell"), None)
        if shell is not None:  # the table's schema, as the harness declares it
            assert shell["function"]["parameters"]["properties"]["command"]["type"] == "array"
