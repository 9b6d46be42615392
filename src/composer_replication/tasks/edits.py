"""Recorded file changes, replayed: Claude Code ``Edit``/``MultiEdit``/``Write`` and Codex ``apply_patch``.

`replay` applies an episode's changes, in order, to the files of its starting state (never to a
working tree) and returns the files they changed. It refuses, with one line naming the path, a change
outside the repository (an absolute path elsewhere, ``..``, a path through a symlink that leaves the
tree, anything under ``.git/``) and reports a change that does not apply (the text to replace is not
there, a file to update does not exist): the episode is then dropped with that reason.

The Codex patch format (``*** Begin Patch`` ... ``*** End Patch``: ``Add File``, ``Delete File``,
``Update File`` with an optional ``Move to``, hunks of `` ``/``-``/``+`` lines after ``@@ [context]``) is
applied the way Codex applies it: each hunk's old lines are looked for from the previous hunk on, exactly,
then ignoring trailing, then surrounding whitespace.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from composer_replication.tasks.repo import RepoLocation, map_path, resolve_inside

EDIT_TOOLS = frozenset({"Edit", "MultiEdit", "Write", "NotebookEdit", "apply_patch"})
_PATCH = re.compile(r"\*\*\* Begin Patch\n.*?\n\*\*\* End Patch", re.S)


class ReplayError(ValueError):
    """An episode's changes cannot be replayed; ``reason`` is the report's drop reason."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


@dataclass
class Op:
    """One recorded change: the tool, its input, and the directory relative paths start from."""

    tool: str
    args: dict[str, Any]
    cwd: str


def patch_text(tool_input: Any) -> str | None:
    """The ``*** Begin Patch`` text of a Codex call (custom tool input, argv, or a here-document)."""
    if isinstance(tool_input, dict):
        vals = [
            tool_input.get("input"),
            tool_input.get("patch"),
            tool_input.get("command"),
            tool_input.get("cmd"),
        ]
        text = "\n".join(v if isinstance(v, str) else "\n".join(map(str, v)) for v in vals if v)
    else:
        text = str(tool_input or "")
    m = _PATCH.search(text.replace("\r\n", "\n"))
    return m.group(0) if m else None


class _Tree:
    """The files being changed: starting contents plus the changes so far (None = deleted)."""

    def __init__(self, files: dict[str, bytes], symlinks: dict[str, str], loc: RepoLocation, repo_map: Any):
        self.files, self.symlinks, self.loc, self.repo_map = files, symlinks, loc, repo_map
        self.changes: dict[str, bytes | None] = {}

    def rel(self, path: str, cwd: str) -> str:
        if not isinstance(path, str) or not path:
            raise ReplayError("patch does not apply", f"a change names no file ({path!r})")
        p = posixpath.normpath(path if path.startswith("/") else posixpath.join(cwd, path))
        tops = {self.loc.recorded_top, map_path(self.loc.recorded_top, self.repo_map), self.loc.top}
        rel = next((p[len(t) :].lstrip("/") for t in tops if p.startswith(t.rstrip("/") + "/")), None)
        if rel is None:
            raise ReplayError("edits outside the repository", f"{path} is outside {self.loc.recorded_top}")
        inside = resolve_inside(rel, self.symlinks)
        if inside is None:
            raise ReplayError(
                "edits outside the repository", f"{path} goes through a symlink that leaves the repository"
            )
        if inside == ".git" or inside.startswith(".git/"):
            raise ReplayError("edits outside the repository", f"{path} is inside .git")
        return inside

    def read(self, rel: str) -> str | None:
        data = self.changes[rel] if rel in self.changes else self.files.get(rel)
        return None if data is None else data.decode("utf-8", "surrogateescape")

    def write(self, rel: str, text: str | None) -> None:
        self.changes[rel] = None if text is None else text.encode("utf-8", "surrogateescape")


def repo_path(path: str, cwd: str, loc: RepoLocation, symlinks: dict[str, str], repo_map: Any = ()) -> str:
    """``path`` (absolute, or relative to ``cwd``) as a repository-relative path; `ReplayError` if outside."""
    return _Tree({}, symlinks, loc, list(repo_map)).rel(path, cwd)


def replay(
    files: dict[str, bytes], symlinks: dict[str, str], ops: list[Op], loc: RepoLocation, repo_map: Any = ()
) -> dict[str, bytes | None]:
    """The files ``ops`` change (path -> new bytes, None = deleted), applied to ``files`` in order.

    Raises `ReplayError` (reason ``edits outside the repository`` or ``patch does not apply``)."""
    tree = _Tree(files, symlinks, loc, list(repo_map))
    for op in ops:
        if op.tool == "apply_patch":
            _apply_codex(tree, op)
        elif op.tool == "Write":
            tree.write(tree.rel(op.args.get("file_path", ""), op.cwd), str(op.args.get("content", "")))
        elif op.tool in ("Edit", "MultiEdit"):
            rel = tree.rel(op.args.get("file_path", ""), op.cwd)
            edits = op.args.get("edits") if op.tool == "MultiEdit" else [op.args]
            text = tree.read(rel)
            for e in edits if isinstance(edits, list) else []:
                text = _edit(rel, text, e if isinstance(e, dict) else {})
            tree.write(rel, text)
        else:
            raise ReplayError("patch does not apply", f"{op.tool} changes cannot be replayed")
    return {p: d for p, d in tree.changes.items() if d != files.get(p)}


def _edit(rel: str, text: str | None, e: dict[str, Any]) -> str:
    old, new = str(e.get("old_string", "")), str(e.get("new_string", ""))
    if text is None:
        if old == "":
            return new  # Claude Code creates a file from an edit with an empty old_string
        raise ReplayError("patch does not apply", f"{rel}: edited, but it does not exist at the start")
    if old == "":
        raise ReplayError("patch does not apply", f"{rel}: an edit with no text to replace")
    n = text.count(old)
    if n == 0:
        raise ReplayError("patch does not apply", f"{rel}: the text to replace is not in the file")
    if n > 1 and not e.get("replace_all"):
        raise ReplayError("patch does not apply", f"{rel}: the text to replace occurs {n} times")
    return text.replace(old, new) if e.get("replace_all") else text.replace(old, new, 1)


def _apply_codex(tree: _Tree, op: Op) -> None:
    text = patch_text(op.args)
    if text is None:
        raise ReplayError("patch does not apply", "an apply_patch call without a *** Begin Patch block")
    base = str(op.args.get("workdir") or op.cwd)
    lines = text.split("\n")[1:-1]
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("*** Add File: "):
            rel = tree.rel(line[14:].strip(), base)
            body, i = _take(lines, i + 1, lambda s: s.startswith("+"))
            tree.write(rel, "".join(s[1:] + "\n" for s in body))
        elif line.startswith("*** Delete File: "):
            rel = tree.rel(line[17:].strip(), base)
            if tree.read(rel) is None:
                raise ReplayError("patch does not apply", f"{rel}: deleted, but it does not exist")
            tree.write(rel, None)
            i += 1
        elif line.startswith("*** Update File: "):
            rel = tree.rel(line[17:].strip(), base)
            i += 1
            dest = rel
            if i < len(lines) and lines[i].startswith("*** Move to: "):
                dest = tree.rel(lines[i][13:].strip(), base)
                i += 1
            body, i = _take(lines, i, lambda s: not s.startswith("*** ") or s == "*** End of File")
            old = tree.read(rel)
            if old is None:
                raise ReplayError("patch does not apply", f"{rel}: updated, but it does not exist")
            new = _update(rel, old, body)
            if dest != rel:
                tree.write(rel, None)
            tree.write(dest, new)
        elif line.strip():
            raise ReplayError("patch does not apply", f"unexpected patch line {line[:60]!r}")
        else:
            i += 1


def _take(lines: list[str], i: int, keep: Any) -> tuple[list[str], int]:
    start = i
    while i < len(lines) and keep(lines[i]):
        i += 1
    return lines[start:i], i


def _update(rel: str, text: str, body: list[str]) -> str:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cursor = 0
    for header, old, new, at_eof in _chunks(body):
        if header:
            k = _seek(lines, [header], cursor, False)
            if k is None:
                raise ReplayError("patch does not apply", f"{rel}: context line {header[:60]!r} not found")
            cursor = k + 1
        if not old:
            at = len(lines)
        else:
            k = _seek(lines, old, cursor, at_eof)
            if k is None:
                raise ReplayError("patch does not apply", f"{rel}: a hunk's lines are not in the file")
            at = k
        lines[at : at + len(old)] = new
        cursor = at + len(new)
    return "\n".join(lines) + "\n"


def _chunks(body: list[str]) -> list[tuple[str, list[str], list[str], bool]]:
    out: list[tuple[str, list[str], list[str], bool]] = []
    old: list[str] = []
    new: list[str] = []
    header, eof, started = "", False, False
    for s in body:
        if s.startswith("@@"):
            if started and (old or new):
                out.append((header, old, new, eof))
            header, old, new, eof, started = s[2:].strip(), [], [], False, True
        elif s == "*** End of File":
            eof = True
        else:
            started = True
            tag, rest = (s[:1], s[1:]) if s else (" ", "")
            if tag in (" ", "-"):
                old.append(rest)
            if tag in (" ", "+"):
                new.append(rest)
            if tag not in (" ", "-", "+"):
                raise ReplayError("patch does not apply", f"bad hunk line {s[:60]!r}")
    if old or new:
        out.append((header, old, new, eof))
    return out


def _seek(lines: list[str], pat: list[str], start: int, at_eof: bool) -> int | None:
    if len(pat) > len(lines):
        return None
    last = len(lines) - len(pat)
    begin = last if at_eof and last >= start else start
    for norm in (lambda s: s, str.rstrip, str.strip):
        want = [norm(p) for p in pat]
        for k in range(begin, last + 1):
            if all(norm(lines[k + j]) == want[j] for j in range(len(pat))):
                return k
    return None
