"""Replaying recorded changes onto a starting state: Claude Code edits and Codex patches, refused paths."""

from __future__ import annotations

import pytest

from composer_replication.tasks.edits import Op, ReplayError, patch_text, replay
from composer_replication.tasks.repo import RepoLocation

LOC = RepoLocation(top="/now/repo", recorded_top="/home/u/repo", subdir="")
FILES = {"calc.py": b"def add(a, b):\n    return a + b\n", "pkg/mod.py": b"x = 1\ny = 2\nz = 3\n"}


def run(*ops: Op, files=None, symlinks=None, repo_map=()):
    return replay(dict(FILES if files is None else files), symlinks or {}, list(ops), LOC, repo_map)


def test_claude_edit_multiedit_write_in_order():
    got = run(
        Op("Edit", {"file_path": "/home/u/repo/calc.py", "old_string": "a + b", "new_string": "a - b"}, "/home/u/repo"),
        Op("MultiEdit", {"file_path": "pkg/mod.py", "edits": [{"old_string": "x = 1", "new_string": "x = 10"},
                                                             {"old_string": "z = 3", "new_string": "z = 30"}]},
           "/home/u/repo"),
        Op("Write", {"file_path": "/home/u/repo/new/file.txt", "content": "hello\n"}, "/home/u/repo"),
        Op("Edit", {"file_path": "/home/u/repo/new/file.txt", "old_string": "hello", "new_string": "bye"}, "/"),
    )  # fmt: skip
    assert got == {
        "calc.py": b"def add(a, b):\n    return a - b\n",
        "pkg/mod.py": b"x = 10\ny = 2\nz = 30\n",
        "new/file.txt": b"bye\n",
    }


def test_edit_whose_text_is_missing_or_ambiguous_does_not_apply():
    with pytest.raises(ReplayError, match="not in the file") as e:
        run(Op("Edit", {"file_path": "/home/u/repo/calc.py", "old_string": "nope", "new_string": "x"}, "/"))
    assert e.value.reason == "patch does not apply"
    dup = {"a.py": b"x\nx\n"}
    with pytest.raises(ReplayError, match="occurs 2 times"):
        run(
            Op("Edit", {"file_path": "/home/u/repo/a.py", "old_string": "x", "new_string": "y"}, "/"),
            files=dup,
        )
    assert run(
        Op(
            "Edit",
            {"file_path": "/home/u/repo/a.py", "old_string": "x", "new_string": "y", "replace_all": True},
            "/",
        ),
        files=dup,
    ) == {"a.py": b"y\ny\n"}


@pytest.mark.parametrize(
    "path, why",
    [
        ("/home/u/other/x.py", "outside"),
        ("/home/u/repo/../other/x.py", "outside"),
        ("../escape.py", "outside"),
        ("/home/u/repo/.git/hooks/pre-commit", ".git"),
        ("/home/u/repo/link/passwd", "symlink"),
    ],
)
def test_changes_outside_the_repository_are_refused(path, why):
    with pytest.raises(ReplayError, match=why) as e:
        run(Op("Write", {"file_path": path, "content": "x"}, "/home/u/repo"), symlinks={"link": "/etc"})
    assert e.value.reason == "edits outside the repository"


def test_symlink_inside_the_tree_is_resolved_and_repo_map_paths_count_as_inside():
    got = run(
        Op("Write", {"file_path": "/home/u/repo/alias/mod.py", "content": "q\n"}, "/"),
        Op("Write", {"file_path": "/now/repo/calc.py", "content": "c\n"}, "/"),
        symlinks={"alias": "pkg"},
    )
    assert got == {"pkg/mod.py": b"q\n", "calc.py": b"c\n"}


def codex(patch: str, workdir: str = "/home/u/repo") -> Op:
    text = f"apply_patch <<'PATCH'\n*** Begin Patch\n{patch}\n*** End Patch\nPATCH\n"
    return Op("apply_patch", {"input": patch_text({"command": ["bash", "-lc", text]})}, workdir)


def test_codex_patch_add_update_delete_move():
    got = run(
        codex(
            "*** Add File: notes/a.md\n+# A\n+text\n"
            "*** Update File: pkg/mod.py\n@@\n x = 1\n-y = 2\n+y = 20\n z = 3\n"
            "*** Delete File: calc.py\n"
        ),
        codex("*** Update File: pkg/mod.py\n*** Move to: pkg/moved.py\n@@\n-z = 3\n+z = 4\n*** End of File"),
    )
    assert got == {"notes/a.md": b"# A\ntext\n", "pkg/mod.py": None, "pkg/moved.py": b"x = 1\ny = 20\nz = 4\n",
                   "calc.py": None}  # fmt: skip


def test_codex_hunks_find_context_headers_and_tolerate_trailing_whitespace():
    files = {"m.py": b"def f():\n    return 1\n\n\ndef g():   \n    return 1\n"}
    got = run(codex("*** Update File: m.py\n@@ def g():\n-    return 1\n+    return 2"), files=files)
    assert got == {"m.py": b"def f():\n    return 1\n\n\ndef g():   \n    return 2\n"}
    got = run(codex("*** Update File: m.py\n@@\n-def g():\n+def h():"), files=files)
    assert got["m.py"].endswith(b"def h():\n    return 1\n")


def test_codex_patch_that_does_not_match_is_reported():
    with pytest.raises(ReplayError, match="hunk") as e:
        run(codex("*** Update File: calc.py\n@@\n-return a * b\n+return 0"))
    assert e.value.reason == "patch does not apply"
    with pytest.raises(ReplayError, match="does not exist"):
        run(codex("*** Update File: missing.py\n@@\n-a\n+b"))


def test_patch_text_is_found_in_argv_heredoc_and_custom_tool_input():
    body = "*** Begin Patch\n*** Add File: x\n+1\n*** End Patch"
    assert patch_text({"input": body}) == body
    assert patch_text({"command": ["apply_patch", body]}) == body
    assert patch_text({"cmd": f"cd /r && apply_patch <<'EOF'\n{body}\nEOF"}) == body
    assert patch_text({"command": "pytest -q"}) is None
