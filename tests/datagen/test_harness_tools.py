"""The harnesses' tools over a real bubblewrap sandbox, against the shapes of real session logs: Claude Code's
tool_result texts and toolUseResult records (datagen.harness_claude / harness_search), Codex's shell
output JSON, apply_patch and update_plan texts (datagen.harness_codex)."""

from __future__ import annotations

import json
import shutil

import pytest

from composer_replication.datagen.harness_claude import ClaudeCodeTools, structured_patch
from composer_replication.datagen.harness_codex import CodexTools
from composer_replication.datagen.sandbox import make_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

FILES = {
    "src/a.py": "def f():\n    return 1\n\nx = f()\n",
    "src/b.py": "import a\nprint(a.f())\n",
    "README.md": "hi\n",
}


@pytest.fixture
def sb():
    with make_sandbox("bwrap") as box:
        for path, text in FILES.items():
            box.put(path, text)
        yield box


def test_read_numbers_lines_like_claude_code_and_records_the_window(sb):
    t = ClaudeCodeTools(sb)
    o = t.call("Read", {"file_path": "/workspace/src/a.py"})
    assert o.content == "     1→def f():\n     2→    return 1\n     3→\n     4→x = f()\n     5→"
    assert not o.is_error
    assert o.tool_use_result == {
        "type": "text",
        "file": {
            "filePath": "/workspace/src/a.py",
            "content": FILES["src/a.py"],
            "numLines": 5,
            "startLine": 1,
            "totalLines": 5,
        },
    }
    o = t.call("Read", {"file_path": "src/a.py", "offset": 2, "limit": 2})
    assert o.content == "     2→    return 1\n     3→"
    assert o.tool_use_result["file"] | {"content": None} == {
        "filePath": "/workspace/src/a.py",
        "content": None,
        "numLines": 2,
        "startLine": 2,
        "totalLines": 5,
    }
    o = t.call("Read", {"file_path": "nope.py"})
    assert (o.content, o.is_error, o.tool_use_result) == (
        "<tool_use_error>File does not exist.</tool_use_error>",
        True,
        "Error: File does not exist.",
    )


def test_edit_errors_and_success_shapes(sb):
    t = ClaudeCodeTools(sb)
    o = t.call("Edit", {"file_path": "/workspace/src/b.py", "old_string": "a", "new_string": "b"})
    assert o.tool_use_result == "Error: File has not been read yet. Read it first before writing to it."
    t.call("Read", {"file_path": "/workspace/src/b.py"})
    o = t.call("Edit", {"file_path": "/workspace/src/b.py", "old_string": "a", "new_string": "b"})
    assert o.is_error and o.content.startswith(
        "<tool_use_error>Found 2 matches of the string to replace, but replace_all is false."
    )
    o = t.call("Edit", {"file_path": "/workspace/src/b.py", "old_string": "zzz", "new_string": "b"})
    assert o.content == "<tool_use_error>String to replace not found in file.\nString: zzz</tool_use_error>"
    o = t.call("Edit", {"file_path": "/workspace/src/b.py", "old_string": "a.f()", "new_string": "a.g()"})
    assert (o.content, o.is_error) == ("The file /workspace/src/b.py has been updated successfully.", False)
    assert list(o.tool_use_result) == [
        "filePath",
        "oldString",
        "newString",
        "originalFile",
        "structuredPatch",
        "userModified",
        "replaceAll",
    ]
    assert o.tool_use_result["structuredPatch"] == [
        {
            "oldStart": 1,
            "oldLines": 3,
            "newStart": 1,
            "newLines": 3,
            "lines": [" import a", "-print(a.f())", "+print(a.g())", " "],
        }
    ]
    assert sb.get("src/b.py") == b"import a\nprint(a.g())\n"
    # a command changes the file: it must be read again
    sb.exec("echo '# more' >> src/b.py")
    o = t.call("Edit", {"file_path": "src/b.py", "old_string": "import a", "new_string": "import c"})
    assert "File has been modified since read" in o.content and o.is_error
    # replace_all, and MultiEdit's summary lines (50 characters, then ...)
    t.call("Read", {"file_path": "src/b.py"})
    o = t.call("Edit", {"file_path": "src/b.py", "old_string": "a", "new_string": "A", "replace_all": True})
    assert o.content.endswith("All occurrences of 'a' were successfully replaced with 'A'.")
    long = "x" * 60
    o = t.call(
        "MultiEdit", {"file_path": "src/b.py", "edits": [{"old_string": "import A", "new_string": long}]}
    )
    assert o.content == f'Applied 1 edit to /workspace/src/b.py:\n1. Replaced "import A" with "{"x" * 50}..."'
    assert o.tool_use_result["edits"] == [
        {"old_string": "import A", "new_string": long, "replace_all": False}
    ]


def test_write_bash_and_todos(sb):
    t = ClaudeCodeTools(sb)
    o = t.call("Write", {"file_path": "/workspace/new/n.txt", "content": "x\n"})
    assert o.content == "File created successfully at: /workspace/new/n.txt"
    assert o.tool_use_result == {
        "type": "create",
        "filePath": "/workspace/new/n.txt",
        "content": "x\n",
        "structuredPatch": [],
        "originalFile": None,
    }
    o = t.call("Write", {"file_path": "/workspace/new/n.txt", "content": "y\n"})
    assert o.tool_use_result["type"] == "update" and o.tool_use_result["originalFile"] == "x\n"
    o = t.call("Bash", {"command": "ls src; exit 3", "description": "list"})
    assert (o.content, o.is_error, o.tool_use_result) == (
        "Exit code 3\na.py\nb.py",
        True,
        "Error: Exit code 3\na.py\nb.py",
    )
    o = t.call("Bash", {"command": "cat README.md"})
    assert (o.content, o.is_error) == ("hi", False)
    assert o.tool_use_result == {
        "stdout": "hi",
        "stderr": "",
        "interrupted": False,
        "isImage": False,
        "noOutputExpected": False,
    }
    o = t.call("Bash", {"command": "ls | grep nothing-here"})
    assert (o.content, o.is_error, o.tool_use_result["returnCodeInterpretation"]) == (
        "",
        False,
        "No matches found",
    )
    o = t.call("Bash", {"command": "sleep 5", "timeout": 500})
    assert o.is_error and o.content == "Command timed out after 0.5s" and o.tool_use_result["interrupted"]
    todos = [{"content": "fix", "status": "pending", "activeForm": "Fixing"}]
    o = t.call("TodoWrite", {"todos": todos})
    assert o.content.startswith("Todos have been modified successfully.")
    assert o.tool_use_result == {"oldTodos": [], "newTodos": todos}


def test_grep_glob_ls_modes(sb):
    t = ClaudeCodeTools(sb)
    o = t.call("Grep", {"pattern": r"f\("})
    assert o.content.splitlines()[0] == "Found 2 files"
    assert sorted(o.content.splitlines()[1:]) == ["/workspace/src/a.py", "/workspace/src/b.py"]
    assert o.tool_use_result["mode"] == "files_with_matches" and o.tool_use_result["numFiles"] == 2
    o = t.call("Grep", {"pattern": r"f\(", "output_mode": "content", "path": "/workspace/src"})
    assert (
        o.content
        == "/workspace/src/a.py:1:def f():\n/workspace/src/a.py:4:x = f()\n/workspace/src/b.py:2:print(a.f())"
    )
    o = t.call("Grep", {"pattern": "return", "output_mode": "content", "path": "src/a.py", "-C": 1})
    assert o.content == "1-def f():\n2:    return 1\n3-"
    o = t.call("Grep", {"pattern": "F", "-i": True, "output_mode": "count", "glob": "*.py"})
    assert (
        o.content
        == "/workspace/src/a.py:2\n/workspace/src/b.py:1\n\nFound 3 total occurrences across 2 files."
    )
    assert o.tool_use_result["numMatches"] == 3
    assert t.call("Grep", {"pattern": "zzz"}).content == "No files found"
    assert t.call("Grep", {"pattern": "zzz", "output_mode": "content"}).content == "No matches found"
    o = t.call("Grep", {"pattern": "(unclosed"})
    assert o.is_error and "regex" in o.content
    o = t.call("Glob", {"pattern": "**/*.py"})
    assert sorted(o.content.splitlines()) == ["/workspace/src/a.py", "/workspace/src/b.py"]
    assert o.tool_use_result["numFiles"] == 2 and o.tool_use_result["truncated"] is False
    assert t.call("Glob", {"pattern": "*.rs"}).content == "No files found"
    o = t.call("LS", {"path": "/workspace"})
    assert o.content == "- /workspace/\n  - README.md\n  - src/\n    - a.py\n    - b.py"
    assert t.call("LS", {"path": "/workspace", "ignore": ["*.md"]}).content.count("README") == 0


def test_claude_arguments_are_checked_and_unknown_tools_refused(sb):
    t = ClaudeCodeTools(sb)
    o = t.call("Read", {"path": "x"})
    assert o.is_error and o.content.startswith("<tool_use_error>InputValidationError: Read failed")
    assert "file_path" in o.content
    assert t.call("Frob", {}).content == "<tool_use_error>No such tool available: Frob</tool_use_error>"
    four = ClaudeCodeTools(sb, tools=("Bash", "Read", "Write", "Edit"))
    assert (
        four.call("Grep", {"pattern": "x"}).content
        == "<tool_use_error>No such tool available: Grep</tool_use_error>"
    )


def test_structured_patch_matches_unified_diff_hunks():
    lines = [str(i) for i in range(20)]
    old = "\n".join(lines) + "\n"
    new = "\n".join(lines[:3] + ["three"] + lines[4:15] + lines[16:]) + "\n"
    hunks = structured_patch(old, new)
    assert [(h["oldStart"], h["oldLines"], h["newStart"], h["newLines"]) for h in hunks] == [
        (1, 7, 1, 7),
        (13, 7, 13, 6),
    ]
    assert hunks[0]["lines"][3:5] == ["-3", "+three"]


def test_codex_shell_output_json_workdir_and_timeout(sb):
    t = CodexTools(sb)
    o = t.call("shell", {"command": ["bash", "-lc", "ls"], "workdir": "/workspace/src"})
    out = json.loads(o.content)
    assert out["output"] == "a.py\nb.py\n" and out["metadata"]["exit_code"] == 0 and not o.is_error
    assert list(out) == ["output", "metadata"] and list(out["metadata"]) == ["exit_code", "duration_seconds"]
    assert o.content.startswith('{"output":"a.py\\nb.py\\n","metadata":{"exit_code":0,')
    o = t.call("shell", {"command": ["bash", "-lc", "ls lib/ai"]})
    out = json.loads(o.content)
    assert out["metadata"]["exit_code"] == 2 and "No such file or directory" in out["output"] and o.is_error
    o = t.call("shell", {"command": ["sleep", "5"], "timeout_ms": 300})
    out = json.loads(o.content)
    assert out["metadata"]["exit_code"] == 124 and out["output"].startswith(
        "command timed out after 300 milliseconds"
    )
    o = t.call("shell", {"command": ["ls"], "workdir": "/etc"})
    assert json.loads(o.content)["metadata"]["exit_code"] == 1 and "outside the workspace" in o.content


def test_codex_apply_patch_three_ways_and_its_errors(sb):
    t = CodexTools(sb)
    body = (
        "*** Begin Patch\n*** Update File: src/a.py\n@@ def f():\n-    return 1\n+    return 2\n*** End Patch"
    )
    o = t.call("apply_patch", {"input": body})
    assert json.loads(o.content)["output"] == "Success. Updated the following files:\nM src/a.py\n"
    assert sb.get("src/a.py").startswith(b"def f():\n    return 2\n")
    o = t.call(
        "shell", {"command": ["apply_patch", "*** Begin Patch\n*** Add File: c.txt\n+c\n*** End Patch\n"]}
    )
    assert json.loads(o.content)["output"] == "Success. Updated the following files:\nA c.txt\n"
    heredoc = "cd src && apply_patch <<'PATCH'\n*** Begin Patch\n*** Delete File: b.py\n*** End Patch\nPATCH"
    o = t.call("shell", {"command": ["bash", "-lc", heredoc]})
    assert json.loads(o.content)["output"] == "Success. Updated the following files:\nD b.py\n"
    assert not sb.exec("test -e src/b.py").ok
    o = t.call("apply_patch", {"input": body})  # already applied: the old line is gone
    assert o.is_error and o.content == (
        "apply_patch verification failed: Failed to find expected lines in /workspace/src/a.py:\n    return 1"
    )
    o = t.call("apply_patch", {"input": "*** Begin Patch\n*** End Patch"})
    assert json.loads(o.content) == {
        "output": "No files were modified.\n",
        "metadata": {"exit_code": 1, "duration_seconds": 0.0},
    }
    o = t.call("shell", {"command": [body]})
    assert o.content.startswith("apply_patch verification failed: patch detected without explicit call")


def test_codex_update_plan_and_bad_calls(sb):
    t = CodexTools(sb)
    plan = [{"step": "inspect", "status": "completed"}, {"step": "fix", "status": "in_progress"}]
    o = t.call("update_plan", {"explanation": "go", "plan": plan})
    assert (o.content, o.is_error, t.plan) == ("Plan updated", False, plan)
    assert t.call("update_plan", {"plan": [{"step": "x", "status": "done"}]}).content.startswith(
        "failed to parse function arguments: plan[0].status must be one of"
    )
    assert t.call("shell", {"cmd": "ls"}).content.startswith("failed to parse function arguments: ")
    assert t.call("Bash", {"command": "ls"}).content == "unsupported call: Bash"
    assert t.call("_invalid", {"error": "not JSON"}).content == "failed to parse function arguments: not JSON"
