"""Codex's ``apply_patch`` format: parse a ``*** Begin Patch`` envelope and apply it to a workspace.

Covered (the documented grammar and the Codex CLI's observable behaviour, written from those facts):
the envelope ``*** Begin Patch`` ... ``*** End Patch`` (markers may carry whitespace; a heredoc
wrapper ``<<'EOF'`` ... ``EOF`` is stripped) holding ``*** Add File: P`` (``+`` lines are the content),
``*** Delete File: P`` and ``*** Update File: P`` (optionally ``*** Move to: Q``) with chunks: ``@@`` or
``@@ <context line>``, then `` ``/``-``/``+`` lines and an optional ``*** End of File`` (the first chunk
may omit its ``@@``). A chunk is located after its ``@@`` line, its old lines matched exactly, then
ignoring trailing whitespace, then surrounding whitespace, then with Unicode dashes, quotes and spaces
read as ASCII (``*** End of File``: at the end only). Errors use Codex's words (``invalid patch: ...``,
``invalid hunk at line N, ...``, ``Failed to find expected lines in P:``, ``Failed to find context
'...' in P``, ``Failed to read file to update P: ...``); every update and delete is verified against
the files before anything is written, then the operations run in order and are summarised as
``Success. Updated the following files:`` with ``A``/``M``/``D`` lines.

Workspace safety (stricter than Codex): every path must be relative, or absolute under the workspace
root, without ``..``; anything else is refused before a file is touched, in Codex's rejection words.
Files are touched only through a `PatchFiles` object (the harness passes one over the sandbox).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from typing import Protocol

from composer_replication.datagen.harness_base import workspace_relpath

__all__ = [
    "PatchError",
    "PatchFiles",
    "PatchOp",
    "add_files_patch",
    "apply_patch",
    "extract_invocation",
    "parse_patch",
]

BEGIN, END = "*** Begin Patch", "*** End Patch"
ADD, DELETE, UPDATE, MOVE = "*** Add File: ", "*** Delete File: ", "*** Update File: ", "*** Move to: "
EOF_MARKER = "*** End of File"
REJECTED = "patch rejected: writing outside of the project; rejected by user approval settings"
IMPLICIT = 'patch detected without explicit call to apply_patch. Rerun as ["apply_patch", "<patch>"]'


class PatchError(ValueError):
    """A patch that cannot be parsed, verified or applied; ``str(e)`` is Codex's message.

    ``stage`` (how Codex reports it): ``"verify"`` (unparsable, or not fitting the files) and
    ``"rejected"`` (a path outside the workspace): nothing written; ``"apply"``: failed while writing.
    """

    def __init__(self, message: str, stage: str = "verify") -> None:
        super().__init__(message)
        self.stage = stage


class PatchFiles(Protocol):
    """Workspace file access for `apply_patch` (paths are workspace-relative, already checked)."""

    def read(self, path: str) -> str: ...

    def write(self, path: str, text: str) -> None: ...

    def remove(self, path: str) -> None: ...


@dataclass
class Chunk:
    context: str | None
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    eof: bool = False


@dataclass
class PatchOp:
    """One file operation: ``kind`` is ``add``, ``delete`` or ``update``."""

    kind: str
    path: str
    contents: str = ""  # add
    move_to: str | None = None  # update
    chunks: list[Chunk] = field(default_factory=list)  # update


# --------------------------------------------------------------------------- parsing
def _lines(text: str) -> list[str]:
    text = text.strip()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")] if text else []


def _check_bounds(lines: list[str]) -> None:
    first = lines[0].strip() if lines else None
    last = lines[-1].strip() if lines else None
    if first == BEGIN and last == END and len(lines) >= 2:
        return
    if first != BEGIN:
        raise PatchError("invalid patch: The first line of the patch must be '*** Begin Patch'")
    raise PatchError("invalid patch: The last line of the patch must be '*** End Patch'")


def _body(lines: list[str]) -> list[str]:
    """The lines between the markers; a heredoc wrapper (``<<'EOF'`` ... ``EOF``) is tolerated."""
    try:
        _check_bounds(lines)
        return lines[1:-1]
    except PatchError:
        heredoc = (
            len(lines) >= 4 and lines[0] in ("<<EOF", "<<'EOF'", '<<"EOF"') and lines[-1].endswith("EOF")
        )
        if not heredoc:
            raise
        _check_bounds(lines[1:-1])
        return lines[2:-2]


def parse_patch(text: str) -> list[PatchOp]:
    """The file operations of ``text``; raises `PatchError` with Codex's message and line number."""
    body = _body(_lines(text))
    ops: list[PatchOp] = []
    i, line_no = 0, 2
    while i < len(body):
        op, used = _parse_op(body[i:], line_no)
        ops.append(op)
        i += used
        line_no += used
    return ops


def _hunk_error(line_no: int, msg: str) -> PatchError:
    return PatchError(f"invalid hunk at line {line_no}, {msg}")


def _parse_op(lines: list[str], line_no: int) -> tuple[PatchOp, int]:
    head = lines[0].strip()
    if head.startswith(ADD):
        n = 1
        content = []
        while n < len(lines) and lines[n].startswith("+"):
            content.append(lines[n][1:] + "\n")
            n += 1
        return PatchOp("add", head[len(ADD) :], contents="".join(content)), n
    if head.startswith(DELETE):
        return PatchOp("delete", head[len(DELETE) :]), 1
    if not head.startswith(UPDATE):
        raise _hunk_error(
            line_no,
            f"'{head}' is not a valid hunk header. Valid hunk headers: '*** Add File: {{path}}', "
            "'*** Delete File: {path}', '*** Update File: {path}'",
        )
    path, n = head[len(UPDATE) :], 1
    op = PatchOp("update", path)
    if n < len(lines) and lines[n].startswith(MOVE):
        op.move_to, n = lines[n][len(MOVE) :], n + 1
    while n < len(lines):
        if not lines[n].strip():
            n += 1
            continue
        if lines[n].startswith("*"):
            break
        chunk, used = _parse_chunk(lines[n:], line_no + n, first=not op.chunks)
        op.chunks.append(chunk)
        n += used
    if not op.chunks:
        raise _hunk_error(line_no, f"Update file hunk for path '{path}' is empty")
    return op, n


def _parse_chunk(lines: list[str], line_no: int, *, first: bool) -> tuple[Chunk, int]:
    if lines[0] == "@@":
        chunk, start = Chunk(None), 1
    elif lines[0].startswith("@@ "):
        chunk, start = Chunk(lines[0][3:]), 1
    elif first:
        chunk, start = Chunk(None), 0
    else:
        raise _hunk_error(
            line_no, f"Expected update hunk to start with a @@ context marker, got: '{lines[0]}'"
        )
    if start >= len(lines):
        raise _hunk_error(line_no + 1, "Update hunk does not contain any lines")
    parsed = 0
    for line in lines[start:]:
        if line == EOF_MARKER:
            if parsed == 0:
                raise _hunk_error(line_no + 1, "Update hunk does not contain any lines")
            chunk.eof, parsed = True, parsed + 1
            break
        tag, rest = line[:1], line[1:]
        if tag == "":
            chunk.old.append("")
            chunk.new.append("")
        elif tag == " ":
            chunk.old.append(rest)
            chunk.new.append(rest)
        elif tag == "+":
            chunk.new.append(rest)
        elif tag == "-":
            chunk.old.append(rest)
        elif parsed == 0:
            raise _hunk_error(
                line_no + 1,
                f"Unexpected line found in update hunk: '{line}'. Every line should start with ' ' "
                "(context line), '+' (added line), or '-' (removed line)",
            )
        else:
            break
        parsed += 1
    return chunk, parsed + start


# --------------------------------------------------------------------------- locating chunks
_PUNCT = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys(
            "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "
        ),
    }
)
_PASSES = (lambda s: s, lambda s: s.rstrip(), lambda s: s.strip(), lambda s: s.strip().translate(_PUNCT))


def seek_sequence(lines: list[str], pattern: list[str], start: int, eof: bool) -> int | None:
    """Index where ``pattern`` occurs in ``lines`` at or after ``start`` (progressively looser passes)."""
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    first = len(lines) - len(pattern) if eof else start
    for norm in _PASSES:
        want = [norm(p) for p in pattern]
        for i in range(max(first, 0), len(lines) - len(pattern) + 1):
            if all(norm(lines[i + k]) == w for k, w in enumerate(want)):
                return i
    return None


def _new_contents(original: str, chunks: list[Chunk], shown: str) -> str:
    lines = original.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    repl: list[tuple[int, int, list[str]]] = []
    at = 0
    for c in chunks:
        if c.context is not None:
            idx = seek_sequence(lines, [c.context], at, False)
            if idx is None:
                raise PatchError(f"Failed to find context '{c.context}' in {shown}")
            at = idx + 1
        if not c.old:
            repl.append((len(lines) - 1 if lines and lines[-1] == "" else len(lines), 0, list(c.new)))
            continue
        old, new = c.old, c.new
        found = seek_sequence(lines, old, at, c.eof)
        if found is None and old[-1] == "":
            old, new = old[:-1], new[:-1] if new and new[-1] == "" else new
            found = seek_sequence(lines, old, at, c.eof)
        if found is None:
            raise PatchError(f"Failed to find expected lines in {shown}:\n" + "\n".join(c.old))
        repl.append((found, len(old), list(new)))
        at = found + len(old)
    for start, n_old, seg in sorted(repl, key=lambda r: r[0], reverse=True):
        lines[start : start + n_old] = seg
    if not lines or lines[-1] != "":
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- applying
def _io_text(e: OSError) -> str:
    code = e.errno or errno.EIO
    return f"{os.strerror(code)} (os error {code})"


def _relpath(path: str, root: str, cwd: str) -> str | None:
    """``path`` (absolute under ``root``, else relative to the workspace directory ``cwd``) as a
    workspace-relative file path, or None when it leaves the workspace or names its root."""
    p = path.strip()
    return workspace_relpath(p if p.startswith("/") or not cwd else f"{cwd}/{p}", root) or None


def apply_patch(text: str, files: PatchFiles, *, root: str = "/workspace", cwd: str = "") -> str:
    """Apply the patch ``text``; return Codex's success summary, raise `PatchError` with its message.

    ``root`` is the workspace as the agent sees it (absolute paths under it are accepted; error
    messages name files under it, as Codex names them by absolute path); relative paths are taken from
    ``cwd``, a workspace-relative directory (the call's ``workdir``). Nothing is written unless
    every update and delete verifies against the current files.
    """
    ops = parse_patch(text)
    rel: dict[str, str] = {}
    for op in ops:
        for p in (op.path, op.move_to):
            if p is not None:
                r = _relpath(p, root, cwd)
                if r is None:
                    raise PatchError(REJECTED, "rejected")
                rel[p] = r
    shown = {p: f"{root.rstrip('/')}/{r}" for p, r in rel.items()}
    for op in ops:  # verification: every change computes against the files as they are now
        _derive(op, files, rel, shown)
    if not ops:
        raise PatchError("No files were modified.", "apply")
    summary = {"A": [], "M": [], "D": []}  # type: dict[str, list[str]]
    for op in ops:
        try:
            new = _derive(op, files, rel, shown)
        except PatchError as e:
            raise PatchError(str(e), "apply") from None
        try:
            if op.kind == "add":
                files.write(rel[op.path], op.contents)
                summary["A"].append(op.path)
            elif op.kind == "delete":
                files.remove(rel[op.path])
                summary["D"].append(op.path)
            else:
                dest = op.move_to or op.path
                files.write(rel[dest], new)
                if op.move_to is not None and rel[op.move_to] != rel[op.path]:
                    files.remove(rel[op.path])
                summary["M"].append(dest)
        except OSError as e:
            verb = {"add": "write file", "delete": "delete file", "update": "write file"}[op.kind]
            raise PatchError(f"Failed to {verb} {shown[op.path]}: {_io_text(e)}", "apply") from None
    out = ["Success. Updated the following files:"]
    out += [f"{k} {p}" for k in "AMD" for p in summary[k]]
    return "\n".join(out) + "\n"


def _derive(op: PatchOp, files: PatchFiles, rel: dict[str, str], shown: dict[str, str]) -> str:
    if op.kind == "add":
        return op.contents
    try:
        original = files.read(rel[op.path])
    except OSError as e:
        what = "Failed to read" if op.kind == "delete" else "Failed to read file to update"
        raise PatchError(f"{what} {shown[op.path]}: {_io_text(e)}") from None
    except UnicodeDecodeError:
        raise PatchError(
            f"Failed to read file to update {shown[op.path]}: stream did not contain valid UTF-8"
        ) from None
    return original if op.kind == "delete" else _new_contents(original, op.chunks, shown[op.path])


# --------------------------------------------------------------------------- invocation through shell
_HEREDOC = re.compile(
    r"\A\s*(?:cd\s+(?P<cd>'[^']*'|\"[^\"$`\\]*\"|[^\s;&|<>'\"]+)\s*&&\s*)?"
    r"(?:apply_patch|applypatch)\s*<<\s*(?P<q>['\"]?)(?P<tag>[A-Za-z_][A-Za-z0-9_]*)(?P=q)[ \t]*\n"
    r"(?P<body>.*?)\n(?P=tag)\s*\Z",
    re.S,
)


def extract_invocation(argv: list[str]) -> tuple[str, str | None] | None:
    """``(patch, cd)`` when ``argv`` invokes apply_patch the ways Codex recognises, else None.

    ``["apply_patch", PATCH]`` (or ``applypatch``), and ``["bash", "-lc", SCRIPT]`` (``-c``; ``sh``,
    ``zsh``) whose whole script is ``[cd DIR && ]apply_patch <<'EOF'`` + the patch + ``EOF``.
    A bare patch as the command (``[PATCH]`` or a shell script that *is* a patch) raises `PatchError`
    (Codex refuses an implicit invocation).
    """
    if len(argv) == 2 and argv[0] in ("apply_patch", "applypatch"):
        return argv[1], None
    script = None
    if len(argv) == 3 and os.path.basename(argv[0]) in ("bash", "sh", "zsh") and argv[1] in ("-lc", "-c"):
        script = argv[2]
    if (len(argv) == 1 and _is_patch(argv[0])) or (script is not None and _is_patch(script)):
        raise PatchError(IMPLICIT)
    m = _HEREDOC.match(script) if script is not None else None
    if m is None:
        return None
    cd = m.group("cd")
    return m.group("body"), cd.strip("'\"") if cd else None


def _is_patch(text: str) -> bool:
    try:
        parse_patch(text)
    except PatchError:
        return False
    return True


def add_files_patch(files: dict[str, str]) -> str:
    """A patch writing each of ``files`` whole (``*** Add File:`` overwrites; a final newline is added)."""
    parts = [BEGIN]
    for path, text in files.items():
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        parts += [ADD + path, *("+" + ln for ln in lines)]
    return "\n".join([*parts, END]) + "\n"
