"""Hostile tool calls against the rollout harnesses, on every sandbox backend: apply_patch paths outside the
workspace (absolute, ``..``, moves, ``cd``), symlinks planted to leave it, malformed hunks and context that
does not match; Claude Code's file and search tools pointed outside. Nothing outside the workspace is read
or written, a refused patch writes nothing, and every refusal is an ordinary tool error (never a crash
or an infrastructure failure)."""

from __future__ import annotations

import json

import pytest

from composer_replication.datagen.harness_claude import ClaudeCodeTools
from composer_replication.datagen.harness_codex import CodexTools

REJECTED = "patch rejected: writing outside of the project; rejected by user approval settings"


def patch(*body: str) -> dict[str, str]:
    return {"input": "\n".join(["*** Begin Patch", *body, "*** End Patch"])}


def listing(sb) -> str:
    return sb.exec("find . | sort").output


@pytest.mark.parametrize(
    "body",
    [
        ["*** Update File: /etc/passwd", "@@", "-root", "+owned"],
        ["*** Add File: ../escape.txt", "+x"],
        ["*** Add File: a/../../escape.txt", "+x"],
        ["*** Add File: /workspace/../escape.txt", "+x"],
        ["*** Add File: /tmp/escape.txt", "+x"],
        ["*** Delete File: /etc/hostname"],
        ["*** Update File: keep.txt", "*** Move to: ../moved.txt", "@@", "-keep", "+moved"],
        ["*** Add File: ok.txt", "+fine", "*** Add File: ../../escape.txt", "+x"],  # valid op first
        ["*** Add File: bad\x00name", "+x"],
    ],
)
def test_patch_paths_outside_the_workspace_are_rejected_and_write_nothing(sandbox_backend, body):
    sb = sandbox_backend()
    sb.put("keep.txt", "keep\n")
    before = listing(sb)
    out = CodexTools(sb).call("apply_patch", patch(*body))
    assert (out.content, out.is_error) == (REJECTED, True)
    assert listing(sb) == before and sb.get("keep.txt") == b"keep\n"
    assert sb.exec("test -e /tmp/escape.txt || test -e ../escape.txt").returncode != 0


@pytest.mark.parametrize(
    "script",
    [
        "cd /etc && apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: x\n+x\n*** End Patch\nEOF",
        "cd .. && apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: x\n+x\n*** End Patch\nEOF",
    ],
)
def test_shell_apply_patch_cannot_cd_out(sandbox_backend, script):
    sb = sandbox_backend()
    before = listing(sb)
    out = CodexTools(sb).call("shell", {"command": ["bash", "-lc", script]})
    assert out.content == REJECTED and listing(sb) == before


def test_planted_symlinks_never_lead_a_patch_out(sandbox_backend, escape_host):
    sb = sandbox_backend()
    canary, secret = escape_host["canary"], escape_host["secret"]
    sb.exec(f"ln -s {canary} link && ln -s {canary.parent} linkdir && ln -s /etc etc")
    tools = CodexTools(sb)
    attempts = [
        patch("*** Update File: link", "@@", f"-{secret}", "+owned"),
        patch("*** Delete File: link"),
        patch("*** Add File: link", "+owned"),
        patch("*** Add File: linkdir/new.txt", "+owned"),
        patch("*** Add File: etc/evil.conf", "+owned"),
        patch("*** Update File: etc/hostname", "@@", "+owned"),
    ]
    for args in attempts:
        out = tools.call("apply_patch", args)
        assert out.is_error and secret not in out.content, out.content
        assert "Permission denied" in out.content, out.content
    assert canary.read_text() == secret
    assert sorted(p.name for p in canary.parent.iterdir()) == ["host_canary.txt"]
    assert sb.exec("test -L link && test -L linkdir").ok  # the links themselves are untouched


@pytest.mark.parametrize(
    "text",
    [
        "*** Begin Patch\n*** Update File: f.txt\n@@\n-a\n+b\n",  # no end marker
        "*** Update File: f.txt\n@@\n-a\n+b\n*** End Patch",  # no begin marker
        "*** Begin Patch\n*** Update File: f.txt\n@@\n!a\n*** End Patch",  # a line with no prefix
        "*** Begin Patch\n*** Update File: f.txt\n*** End Patch",  # no chunk
        "*** Begin Patch\n*** Update File: f.txt\n@@\n*** End of File\n*** End Patch",  # empty chunk
        "*** Begin Patch\n*** Add File: \n+x\n*** End Patch",  # no path
        "*** Begin Patch\n*** Update File: f.txt\n@@\n-not in the file\n+b\n*** End Patch",  # context mismatch
        "*** Begin Patch\n*** Update File: f.txt\n@@ class Missing:\n-a\n+b\n*** End Patch",  # @@ line missing
        "*** Begin Patch\n*** Update File: f.txt\n@@\n-b\n+c\n@@\n-a\n+z\n*** End Patch",  # chunks out of order
        "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Update File: gone.txt\n@@\n-a\n*** End Patch",
        "*** Begin Patch\n*** Update File: f.txt\n*** Move to: /workspace\n@@\n-a\n+b\n*** End Patch",
    ],
)
def test_malformed_or_mismatched_patches_change_nothing(sandbox_backend, text):
    sb = sandbox_backend()
    sb.put("f.txt", "a\nb\n")
    before = listing(sb)
    out = CodexTools(sb).call("apply_patch", {"input": text})
    assert out.is_error
    assert out.content.startswith(("apply_patch verification failed: ", "patch rejected: ")), out.content
    assert listing(sb) == before and sb.get("f.txt") == b"a\nb\n"


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("Read", {"file_path": "/etc/passwd"}),
        ("Read", {"file_path": "../../etc/passwd"}),
        ("Read", {"file_path": "/workspace/../etc/passwd"}),
        ("Write", {"file_path": "/tmp/x.txt", "content": "owned"}),
        ("Edit", {"file_path": "../x.txt", "old_string": "a", "new_string": "b"}),
        ("Grep", {"pattern": "root", "path": "/etc"}),
        ("Glob", {"pattern": "*", "path": "../.."}),
        ("LS", {"path": "/"}),
    ],
)
def test_claude_tools_refuse_paths_outside(sandbox_backend, name, args):
    sb = sandbox_backend()
    before = listing(sb)
    out = ClaudeCodeTools(sb).call(name, args)
    assert out.is_error and "Permission denied" in out.content, out.content
    assert "root:" not in out.content and listing(sb) == before


def test_claude_tools_do_not_follow_planted_symlinks(sandbox_backend, escape_host):
    sb = sandbox_backend()
    canary, secret = escape_host["canary"], escape_host["secret"]
    sb.put("real.txt", "inside\n")
    sb.exec(f"ln -s {canary} link && ln -s {canary.parent} linkdir && ln -s /etc etc && ln -s . loop")
    t = ClaudeCodeTools(sb, require_read=False)
    outs = [
        t.call("Read", {"file_path": "link"}),
        t.call("Write", {"file_path": "link", "content": "owned"}),
        t.call("Write", {"file_path": "linkdir/new.txt", "content": "owned"}),
        t.call("Edit", {"file_path": "etc/hostname", "old_string": "a", "new_string": "b"}),
        t.call("MultiEdit", {"file_path": "link", "edits": [{"old_string": secret, "new_string": "x"}]}),
    ]
    for out in outs:
        assert out.is_error and secret not in out.content and "Permission denied" in out.content, out.content
    searches = [
        t.call("Grep", {"pattern": "canary|root", "output_mode": "content"}),
        t.call("Grep", {"pattern": ".", "path": "linkdir"}),
        t.call("Glob", {"pattern": "**/*"}),
        t.call("LS", {"path": "/workspace"}),
    ]
    for out in searches:
        assert secret not in out.content and "host_canary" not in out.content, out.content
        assert "passwd" not in out.content and "root:" not in out.content
    assert searches[2].content == "/workspace/real.txt"
    assert searches[3].content == "- /workspace/\n  - real.txt"
    assert canary.read_text() == secret and sorted(p.name for p in canary.parent.iterdir()) == [
        "host_canary.txt"
    ]


def test_hostile_arguments_are_tool_errors_not_crashes(sandbox_backend):
    sb = sandbox_backend()
    claude, codex = ClaudeCodeTools(sb), CodexTools(sb)
    cases = [
        claude.call("Read", {"file_path": 7}),
        claude.call("Read", "not an object"),
        claude.call("Bash", {"command": ["ls"]}),
        claude.call("Grep", {"pattern": "(?P<"}),
        claude.call("Grep", {"pattern": "x", "output_mode": "everything"}),
        claude.call("Edit", {"file_path": "/workspace", "old_string": "a", "new_string": "b"}),
        codex.call("shell", {"command": []}),
        codex.call("shell", {"command": "ls"}),
        codex.call("shell", {"command": [1, 2]}),
        codex.call("apply_patch", {"input": 42}),
        codex.call("update_plan", {"plan": "all of it"}),
    ]
    for out in cases:
        assert out.is_error, out
    assert json.dumps([c.content for c in cases])  # all plain text
