"""Claude Code's ``Grep``, ``Glob`` and ``LS`` over a `Sandbox`, with its output texts and records.

The search runs **inside** the sandbox (a fixed Python helper, `_HELPER`, fed the arguments as
base64 JSON), so the host never walks agent-made trees: the helper resolves every path, refuses one
outside the workspace, never follows a symlink (symlinked files and directories are left out, as
ripgrep does without ``--follow``) and skips ``.git``. The host turns its findings into Claude Code's
shapes:

- ``Grep`` (``output_mode`` ``files_with_matches`` by default): ``Found N files`` + absolute paths,
  newest first; ``content``: ripgrep lines ``path:N:text`` (``-n`` on by default; context lines
  ``path-N-text``, groups split by ``--``; no path when searching one file); ``count``: ``path:N`` lines
  then ``Found T total occurrences across F files.``; ``No files found`` / ``No matches found``;
  ``head_limit``/``offset`` page the lines with ``[Showing results with pagination = limit: L, offset:
  O]``. Records ``{mode, filenames, numFiles}`` (+ ``content``, ``numLines`` / ``numMatches``).
  Patterns are Python regular expressions (close to ripgrep's for everyday patterns).
- ``Glob``: absolute paths, oldest first, at most 100 (then ``(Results are truncated. ...)``);
  records ``{filenames, durationMs, numFiles, truncated}``.
- ``LS``: the ``- /workspace/`` tree, two spaces per level, directories with ``/``, hidden entries,
  ``__pycache__`` and ``ignore`` globs left out, ``node_modules`` not entered, at most 1000 entries.
"""

from __future__ import annotations

import time
from typing import Any

from composer_replication.datagen.harness_base import HelperError, ToolOutcome, run_helper, workspace_relpath
from composer_replication.datagen.sandbox import Sandbox

__all__ = ["run"]

GLOB_LIMIT, LS_LIMIT, GREP_CHARS = 100, 1000, 20_000

_HELPER = r"""
import base64, fnmatch, json, os, re, sys
a = json.loads(base64.b64decode(sys.argv[1]))
root = os.path.realpath(os.getcwd())
def out(**kw):
    print(json.dumps(kw)); sys.exit(0)
def glob_re(pat):
    i, res = 0, ""
    while i < len(pat):
        c = pat[i]
        if pat.startswith("**/", i): res += "(?:.*/)?"; i += 3; continue
        if pat.startswith("**", i): res += ".*"; i += 2; continue
        if c == "*": res += "[^/]*"
        elif c == "?": res += "[^/]"
        elif c == "{":
            j = pat.find("}", i)
            if j < 0: res += re.escape(c)
            else: res += "(?:" + "|".join(glob_re(p) for p in pat[i+1:j].split(",")) + ")"; i = j
        elif c == "[":
            j = pat.find("]", i + 1)
            if j < 0: res += re.escape(c)
            else: res += "[" + pat[i+1:j].replace("!", "^", 1) + "]"; i = j
        else: res += re.escape(c)
        i += 1
    return res
try:
    target = os.path.realpath(os.path.join(root, a["rel"]))
    if target != root and not target.startswith(root + os.sep):
        out(error="outside")
    if not os.path.exists(target):
        out(error="missing")
    def walk(top, skip=(".git", ".svn", ".hg")):
        for d, dirs, files in os.walk(top):
            dirs[:] = sorted(x for x in dirs if x not in skip and not os.path.islink(os.path.join(d, x)))
            for f in sorted(files):
                p = os.path.join(d, f)
                if not os.path.islink(p) and os.path.isfile(p):
                    yield p
    op = a["op"]
    if op == "glob":
        rx = re.compile(glob_re(a["pattern"]) + r"\Z")
        hits = [[os.path.relpath(p, root), os.path.getmtime(p)] for p in walk(target)
                if rx.match(os.path.relpath(p, target))]
        out(ok=hits)
    if op == "ls":
        ign = [re.compile(glob_re(g) + r"\Z") for g in a["ignore"]]
        rows = []
        def ls(d, depth):
            for n in sorted(os.listdir(d)):
                p = os.path.join(d, n)
                if n.startswith(".") or n == "__pycache__" or any(r.match(n) for r in ign) or os.path.islink(p):
                    continue
                if len(rows) >= a["limit"]:
                    return
                isdir = os.path.isdir(p)
                rows.append([depth, n + ("/" if isdir else "")])
                if isdir and n != "node_modules":
                    ls(p, depth + 1)
        if not os.path.isdir(target): out(error="notdir")
        ls(target, 1)
        out(ok=rows)
    flags = (re.I if a["i"] else 0) | ((re.S | re.M) if a["multiline"] else 0)
    rx = re.compile(a["pattern"], flags)
    inc = re.compile(glob_re(a["glob"]) + r"\Z") if a["glob"] else None
    exts = a["exts"]
    files = [target] if os.path.isfile(target) else walk(target)
    res = []
    for p in files:
        rel = os.path.relpath(p, root)
        name = rel if (a["glob"] or "").count("/") else os.path.basename(p)
        if inc and not inc.match(name) or exts and not p.endswith(tuple(exts)):
            continue
        with open(p, "rb") as fh:
            data = fh.read()
        if b"\0" in data[:8192]:
            continue
        text = data.decode("utf-8", "replace")
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        if a["multiline"]:
            hit = set()
            for m in rx.finditer(text):
                s = text.count("\n", 0, m.start()); e = text.count("\n", 0, max(m.end() - 1, m.start()))
                hit.update(range(s, e + 1))
        else:
            hit = {k for k, ln in enumerate(lines) if rx.search(ln)}
        if not hit:
            continue
        row = {"path": rel, "mtime": os.path.getmtime(p), "count": len(hit)}
        if a["mode"] == "content":
            keep = sorted({j for k in hit for j in range(max(k - a["before"], 0), min(k + a["after"], len(lines) - 1) + 1)})
            row["lines"] = [[j + 1, lines[j], j in hit] for j in keep]
        res.append(row)
    out(ok=res)
except re.error as e:
    out(error="regex: " + str(e))
except OSError as e:
    out(error="os: " + str(e))
"""

_TYPES = {
    "py": [".py", ".pyi"], "js": [".js", ".jsx", ".mjs", ".cjs"], "ts": [".ts", ".tsx", ".mts", ".cts"],
    "go": [".go"], "rust": [".rs"], "java": [".java"], "c": [".c", ".h"], "cpp": [".cpp", ".cc", ".hpp", ".h"],
    "md": [".md", ".markdown"], "json": [".json"], "yaml": [".yaml", ".yml"], "toml": [".toml"],
    "sh": [".sh", ".bash"], "html": [".html", ".htm"], "css": [".css"], "rb": [".rb"], "txt": [".txt"],
}  # fmt: skip


def _target(path: Any, root: str, default: str = "") -> str:
    rel = workspace_relpath(path if path is not None else default, root)
    if rel is None:
        raise HelperError(f"Permission denied: {path} is outside the workspace ({root})")
    return rel


def _helper(sb: Sandbox, payload: dict[str, Any], path: Any, timeout: float) -> tuple[Any, list[str]]:
    try:
        return run_helper(sb, _HELPER, payload, timeout=min(timeout, 60.0))
    except HelperError as e:
        msg = str(e)
        if msg == "outside":
            raise HelperError(f"Permission denied: {path} resolves outside the workspace") from None
        if msg == "missing":
            raise HelperError(f"Path does not exist: {path}") from None
        if msg == "notdir":
            raise HelperError(f"Path is not a directory: {path}") from None
        raise


def run(sb: Sandbox, name: str, a: dict[str, Any], *, root: str, timeout: float) -> ToolOutcome:
    """``Grep``, ``Glob`` or ``LS`` (arguments already checked against the schema)."""
    return {"Grep": _grep, "Glob": _glob, "LS": _ls}[name](sb, a, root, timeout)


def _glob(sb: Sandbox, a: dict[str, Any], root: str, timeout: float) -> ToolOutcome:
    t0 = time.monotonic()
    payload = {"op": "glob", "rel": _target(a.get("path"), root), "pattern": a["pattern"].lstrip("/")}
    hits, violations = _helper(sb, payload, a.get("path"), timeout)
    hits.sort(key=lambda h: (h[1], h[0]))
    names = [f"{root}/{h[0]}" for h in hits[:GLOB_LIMIT]]
    truncated = len(hits) > GLOB_LIMIT
    text = "\n".join(names) if names else "No files found"
    if truncated:
        text += "\n(Results are truncated. Consider using a more specific path or pattern.)"
    result = {"filenames": names, "durationMs": int((time.monotonic() - t0) * 1000)}
    return ToolOutcome(text, False, result | {"numFiles": len(names), "truncated": truncated}, violations)


def _ls(sb: Sandbox, a: dict[str, Any], root: str, timeout: float) -> ToolOutcome:
    rel = _target(a["path"], root)
    payload = {"op": "ls", "rel": rel, "ignore": list(a.get("ignore") or []), "limit": LS_LIMIT + 1}
    rows, violations = _helper(sb, payload, a["path"], timeout)
    lines = [f"- {root}/{rel + '/' if rel else ''}"] + [f"{'  ' * d}- {n}" for d, n in rows[:LS_LIMIT]]
    text = "\n".join(lines)
    if len(rows) > LS_LIMIT:
        text = (
            f"There are more than {LS_LIMIT} files in the repository. Use the LS tool (passing a specific path), "
            f"Bash tool, and other tools to explore nested directories. The first {LS_LIMIT} files and "
            f"directories are included below:\n\n{text}"
        )
    return ToolOutcome(text, False, text, violations)


def _grep(sb: Sandbox, a: dict[str, Any], root: str, timeout: float) -> ToolOutcome:
    mode = a.get("output_mode") or "files_with_matches"
    if mode not in ("files_with_matches", "content", "count"):
        raise HelperError("InputValidationError: output_mode must be content, files_with_matches or count")
    ctx = a.get("-C")
    before, after = (ctx, ctx) if ctx is not None else (a.get("-B") or 0, a.get("-A") or 0)
    rel = _target(a.get("path"), root)
    exts = _TYPES.get(a["type"], ["." + a["type"]]) if a.get("type") else []
    payload = {"op": "grep", "rel": rel, "pattern": a["pattern"], "glob": a.get("glob") or "", "exts": exts}
    payload |= {"i": bool(a.get("-i")), "multiline": bool(a.get("multiline")), "mode": mode}
    payload |= {
        "before": int(before) if mode == "content" else 0,
        "after": int(after) if mode == "content" else 0,
    }
    rows, violations = _helper(sb, payload, a.get("path"), timeout)
    single = len(rows) == 1 and rows[0]["path"] == rel
    name = {r["path"]: f"{root}/{r['path']}" for r in rows}
    offset, limit = int(a.get("offset") or 0), a.get("head_limit")
    page = (lambda xs: xs[offset : offset + int(limit)]) if limit is not None else (lambda xs: xs[offset:])
    note = (
        f"\n\n[Showing results with pagination = limit: {limit}, offset: {offset}]"
        if limit is not None
        else ""
    )
    if mode == "files_with_matches":
        files = page([name[r["path"]] for r in sorted(rows, key=lambda r: (-r["mtime"], r["path"]))])
        s = "" if len(files) == 1 else "s"
        text = f"Found {len(files)} file{s}\n" + "\n".join(files) + note if files else "No files found"
        return ToolOutcome(
            text, False, {"mode": mode, "filenames": files, "numFiles": len(files)}, violations
        )
    if mode == "count":
        counted = page([(name[r["path"]], r["count"]) for r in rows])
        total, nf = sum(c for _, c in counted), len(counted)
        body = "\n".join(str(c) if single else f"{p}:{c}" for p, c in counted)
        occ, fil = ("occurrence" if total == 1 else "occurrences"), ("file" if nf == 1 else "files")
        text = (
            f"{body}\n\nFound {total} total {occ} across {nf} {fil}.{note}" if counted else "No matches found"
        )
        result = {"mode": mode, "numFiles": nf, "filenames": [], "content": body, "numMatches": total}
        return ToolOutcome(text, False, result, violations)
    out: list[str] = []
    number = a.get("-n", True) is not False
    for r in rows:
        prev = None
        for n, line, is_hit in r["lines"]:
            if (before or after) and out and (prev is None or n > prev + 1):
                out.append("--")  # ripgrep splits context groups (and files) with --
            prev = n
            shown = line if len(line) <= 500 else "[Omitted long matching line]"
            sep = ":" if is_hit else "-"
            head = "" if single else name[r["path"]] + sep
            out.append(f"{head}{n}{sep}{shown}" if number else f"{head}{shown}")
    lines = page(out)
    body = "\n".join(lines)[:GREP_CHARS]
    text = (body or "No matches found") + note
    result = {"mode": mode, "numFiles": len(rows), "filenames": [], "content": body, "numLines": len(lines)}
    return ToolOutcome(text, False, result, violations)
