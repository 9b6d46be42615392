"""Codex's apply_patch grammar and application (datagen.apply_patch) over an in-memory file tree, and once
over a real bubblewrap sandbox. Hostile patches are in tests/adversarial/test_harness_hostile.py."""

from __future__ import annotations

import errno
import shutil

import pytest

from composer_replication.datagen.apply_patch import (
    PatchError,
    add_files_patch,
    apply_patch,
    extract_invocation,
    parse_patch,
)


class Files(dict):
    """A workspace as a dict; directories are the prefixes of its keys."""

    def read(self, path: str) -> str:
        if path not in self:
            code = errno.EISDIR if any(k.startswith(path + "/") for k in self) else errno.ENOENT
            raise OSError(code, "x")
        return self[path]

    def write(self, path: str, text: str) -> None:
        self[path] = text

    def remove(self, path: str) -> None:
        if path not in self:
            raise OSError(errno.EISDIR if any(k.startswith(path + "/") for k in self) else errno.ENOENT, "x")
        del self[path]


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


def failing(text: str, files: Files) -> PatchError:
    before = dict(files)
    with pytest.raises(PatchError) as e:
        apply_patch(text, files)
    if e.value.stage != "apply":
        assert dict(files) == before  # verified before writing: nothing touched
    return e.value


def test_add_update_delete_move_in_one_patch_and_the_summary():
    fs = Files({"modify.txt": "line1\nline2\n", "delete.txt": "gone\n", "old/name.txt": "from\n"})
    out = apply_patch(
        patch(
            "*** Add File: nested/new.txt",
            "+created",
            "*** Delete File: delete.txt",
            "*** Update File: modify.txt",
            "@@",
            "-line2",
            "+changed",
            "*** Update File: old/name.txt",
            "*** Move to: renamed/dir/name.txt",
            "@@",
            "-from",
            "+to",
        ),
        fs,
    )
    assert out == (
        "Success. Updated the following files:\nA nested/new.txt\nM modify.txt\nM renamed/dir/name.txt\n"
        "D delete.txt\n"
    )
    assert fs == {
        "modify.txt": "line1\nchanged\n",
        "nested/new.txt": "created\n",
        "renamed/dir/name.txt": "to\n",
    }


def test_chunks_context_headers_eof_and_pure_additions():
    fs = Files({"m.py": "a\nb\nc\nd\ne\nf\ng\n", "r.py": "class A:\n    x = 1\nclass B:\n    x = 1\n"})
    apply_patch(patch("*** Update File: m.py", "@@", " a", "-b", "+B", "@@", " e", "-f", "+F"), fs)
    assert fs["m.py"] == "a\nB\nc\nd\ne\nF\ng\n"
    apply_patch(patch("*** Update File: r.py", "@@ class B:", "-    x = 1", "+    x = 2"), fs)
    assert fs["r.py"] == "class A:\n    x = 1\nclass B:\n    x = 2\n"  # the @@ line picks the second x
    apply_patch(patch("*** Update File: m.py", "@@", "-g", "+G", "*** End of File"), fs)
    assert fs["m.py"].endswith("F\nG\n")
    apply_patch(patch("*** Update File: m.py", "@@", "+tail"), fs)
    assert fs["m.py"].endswith("G\ntail\n")
    # the first chunk may omit its @@
    apply_patch(patch("*** Update File: m.py", " a", "-B", "+b2"), fs)
    assert fs["m.py"].startswith("a\nb2\n")


def test_deletion_only_trailing_newline_and_overwrites():
    fs = Files({"n.txt": "no newline", "dup.txt": "old\n", "lines.txt": "1\n2\n3\n"})
    apply_patch(patch("*** Update File: n.txt", "@@", "-no newline", "+now with"), fs)
    assert fs["n.txt"] == "now with\n"
    apply_patch(patch("*** Add File: dup.txt", "+new"), fs)
    assert fs["dup.txt"] == "new\n"
    apply_patch(patch("*** Update File: lines.txt", "@@", " 1", "-2", " 3"), fs)
    assert fs["lines.txt"] == "1\n3\n"
    fs["dest.txt"] = "will be replaced\n"
    apply_patch(patch("*** Update File: dup.txt", "*** Move to: dest.txt", "@@", "-new", "+moved"), fs)
    assert "dup.txt" not in fs and fs["dest.txt"] == "moved\n"


def test_lenient_matching_whitespace_and_unicode_punctuation():
    fs = Files({"u.txt": "say \u201chi\u201d \u2013 ok   \n  indented\n"})
    apply_patch(patch("*** Update File: u.txt", "@@", '-say "hi" - ok', "+plain", "-indented", "+flat"), fs)
    assert fs["u.txt"] == "plain\nflat\n"
    # padded markers and a heredoc wrapper are accepted
    apply_patch("<<'EOF'\n  *** Begin Patch  \n*** Add File: h.txt\n+x\n *** End Patch\nEOF\n", fs)
    assert fs["h.txt"] == "x\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bad", "invalid patch: The first line of the patch must be '*** Begin Patch'"),
        (
            "*** Begin Patch\n*** Add File: a\n+x",
            "invalid patch: The last line of the patch must be '*** End Patch'",
        ),
        (patch("*** Update File: m.py"), "invalid hunk at line 2, Update file hunk for path 'm.py' is empty"),
        (
            patch("*** Frobnicate File: m.py"),
            "invalid hunk at line 2, '*** Frobnicate File: m.py' is not a valid hunk header. Valid hunk "
            "headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'",
        ),
        (
            patch("*** Update File: m.py", "@@", "-a", "+b", "oops", "@@", "x"),
            "invalid hunk at line 6, Expected update hunk to start with a @@ context marker, got: 'oops'",
        ),
        (
            patch("*** Update File: m.py", "@@", "?what"),
            "invalid hunk at line 4, Unexpected line found in update hunk: '?what'. Every line should start "
            "with ' ' (context line), '+' (added line), or '-' (removed line)",
        ),
        (
            patch("*** Update File: m.py", "@@", "*** End of File"),
            "invalid hunk at line 4, Update hunk does not contain any lines",
        ),
    ],
)
def test_malformed_patches_get_codex_messages_and_touch_nothing(text, message):
    e = failing(text, Files({"m.py": "a\n"}))
    assert e.stage == "verify" and message in str(e)


def test_verification_failures_name_the_file_and_write_nothing():
    fs = Files({"m.py": "a\nb\n", "dir/x": "1\n"})
    e = failing(patch("*** Add File: new.txt", "+x", "*** Update File: m.py", "@@", "-zzz", "+y"), fs)
    assert str(e) == "Failed to find expected lines in /workspace/m.py:\nzzz" and "new.txt" not in fs
    e = failing(patch("*** Update File: m.py", "@@ def nowhere():", "-a", "+y"), fs)
    assert str(e) == "Failed to find context 'def nowhere():' in /workspace/m.py"
    e = failing(patch("*** Update File: missing.py", "@@", "-a", "+b"), fs)
    assert (
        str(e)
        == "Failed to read file to update /workspace/missing.py: No such file or directory (os error 2)"
    )
    e = failing(patch("*** Delete File: missing.py"), fs)
    assert str(e) == "Failed to read /workspace/missing.py: No such file or directory (os error 2)"
    e = failing(patch("*** Delete File: dir"), fs)
    assert str(e) == "Failed to read /workspace/dir: Is a directory (os error 21)"
    e = failing(patch(), fs)  # an empty patch parses, then modifies nothing
    assert (e.stage, str(e)) == ("apply", "No files were modified.")


def test_parse_patch_and_add_files_patch_round_trip():
    files = {"a.py": "x = 1\n", "pkg/b.py": "y\nz", "empty.txt": ""}
    ops = parse_patch(add_files_patch(files))
    assert [(o.kind, o.path, o.contents) for o in ops] == [
        ("add", "a.py", "x = 1\n"),
        ("add", "pkg/b.py", "y\nz\n"),
        ("add", "empty.txt", ""),
    ]


def test_extract_invocation_forms():
    body = "*** Begin Patch\n*** Add File: foo\n+hi\n*** End Patch"
    assert extract_invocation(["apply_patch", body]) == (body, None)
    assert extract_invocation(["applypatch", body]) == (body, None)
    assert extract_invocation(["bash", "-lc", f"apply_patch <<'PATCH'\n{body}\nPATCH"]) == (body, None)
    assert extract_invocation(["bash", "-c", f'cd sub && apply_patch <<"EOF"\n{body}\nEOF\n']) == (
        body,
        "sub",
    )
    assert extract_invocation(["bash", "-lc", f"echo hi; apply_patch <<EOF\n{body}\nEOF"]) is None
    assert extract_invocation(["bash", "-lc", "ls -la"]) is None
    for bare in ([body], ["bash", "-lc", body]):
        with pytest.raises(PatchError, match=r'Rerun as \["apply_patch", "<patch>"\]'):
            extract_invocation(bare)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_apply_patch_over_a_real_sandbox():
    from composer_replication.datagen.harness_codex import SandboxPatchFiles
    from composer_replication.datagen.sandbox import make_sandbox

    with make_sandbox("bwrap") as sb:
        sb.put("src/m.py", "def f():\n    return 1\n")
        sb.put("old.txt", "bye\n")
        out = apply_patch(
            patch(
                "*** Update File: /workspace/src/m.py",
                "@@ def f():",
                "-    return 1",
                "+    return 2",
                "*** Delete File: old.txt",
                "*** Add File: deep/er/new.txt",
                "+hello",
            ),
            SandboxPatchFiles(sb),
        )
        assert out.splitlines()[1:] == ["A deep/er/new.txt", "M /workspace/src/m.py", "D old.txt"]
        assert sb.get("src/m.py") == b"def f():\n    return 2\n"
        assert sb.get("deep/er/new.txt") == b"hello\n"
        assert not sb.exec("test -e old.txt").ok
