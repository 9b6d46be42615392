"""Bulk file I/O with a sandbox's workspace: what an agent changed (`read_changes`), and many files in
(`put_files`), each in a few commands whatever the file count.

`read_changes(task, sb)` works from inside the sandbox, after the agent's last command (when none of
its processes is left: both backends kill them after every command), with the system Python in
isolated mode (``python3 -I -S``: no site, no user site, no workspace on ``sys.path``, so nothing the
agent wrote is imported). A first pass lists the workspace (kind, size, SHA-256 of each file; an
iterative, sorted walk of any depth that stops after the task's file count plus `tasks.MAX_TASK_FILES`
entries); a second reads back only the files whose hash differs from the task's. Both come back on
standard output, compressed, in as many commands as the sandbox's output cap needs, so a workspace the
agent filled, made read-only or cluttered costs bytes, not one command per file; entries the agent made
unreadable are made readable first. A symlink is read through when it stays inside the workspace and
dropped otherwise; FIFOs, sockets and devices are dropped; a task file that is gone, unreadable or no
longer a regular file counts as deleted. Changes beyond `tasks.MAX_TASK_FILES` files or
`tasks.MAX_TASK_BYTES` bytes are dropped (in path order).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shlex
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from composer_replication.datagen.sandbox_base import Sandbox, SandboxError
from composer_replication.datagen.tasks import MAX_TASK_BYTES, MAX_TASK_FILES, Task

__all__ = ["Changes", "output_cap", "put_files", "put_task_files", "read_changes"]

Changes = dict[str, bytes | None]

# argv: mode ("list" | "read"), root, entry limit, output budget, start, [bitmap of the entries to read,
# zlib + base64: a list of indices would make a long command, slow for the tripwire to parse]. Prints one
# line "CR-OUT <base64 zlib JSON>". list: {"entries": [[path, kind, size, sha256[:16]]], "next", "more"};
# read: {"files": [[index, offset, base64 bytes]], "next": [index, offset] or None}.
_SCRIPT = r"""
import base64, hashlib, json, os, stat, sys, zlib
mode, root, limit, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def readable(path, bits):
    try:
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & bits != bits:
            os.chmod(path, st.st_mode | bits)
    except OSError:
        pass
names, stack, more = [], [""], False
readable(root, 0o700)
while stack and not more:
    rel_d = stack.pop()
    try:
        with os.scandir(os.path.join(root, rel_d)) as it:
            found = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except OSError:
        continue
    subdirs = []
    for name, is_dir in found:
        rel = os.path.join(rel_d, name) if rel_d else name
        if is_dir:
            readable(os.path.join(root, rel), 0o700)
            subdirs.append(rel)
        elif len(names) < limit:
            names.append(rel)
        else:
            more = True
    stack += reversed(subdirs)
def target(rel):
    full = os.path.join(root, rel)
    real = os.path.realpath(full)
    if os.path.islink(full) and not real.startswith(os.path.realpath(root) + os.sep):
        raise OSError("leaves the workspace")
    readable(real, 0o400)
    return os.open(real, os.O_RDONLY | os.O_NONBLOCK)
def entry(rel):
    try:
        rel.encode("utf-8")
        st = os.lstat(os.path.join(root, rel))
    except (OSError, UnicodeEncodeError):
        return [rel.encode("utf-8", "replace").decode(), "special", 0, ""]
    kind = "link" if stat.S_ISLNK(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "special"
    if kind == "special":
        return [rel, kind, 0, ""]
    h, size = hashlib.sha256(), 0
    try:
        with os.fdopen(target(rel), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return [rel, "special", 0, ""]
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                size += len(block)
    except OSError:
        return [rel, "unreadable", 0, ""]
    return [rel, kind, size, h.hexdigest()[:16]]
if mode == "list":
    out, i, used = [], int(sys.argv[5]), 0
    while i < len(names) and (not out or used < budget):
        out.append(entry(names[i]))
        used += 2 * len(out[-1][0].encode()) + 60  # bounds the encoded size, even for random names
        i += 1
    doc = {"entries": out, "next": i if i < len(names) else None, "more": more}
else:
    bits = zlib.decompress(base64.b64decode(sys.argv[6]))
    wanted = [i for i in range(len(names)) if bits[i // 8] >> (i % 8) & 1]
    k, offset = (int(x) for x in sys.argv[5].split(":"))
    out, used, nxt = [], 0, None
    while k < len(wanted):
        try:
            with os.fdopen(target(names[wanted[k]]), "rb") as f:
                f.seek(offset)
                data = f.read(max((budget - used) // 2, 1))
                rest = f.read(1)
        except OSError:
            data, rest = b"", b""
        out.append([k, offset, base64.b64encode(data).decode()])
        used += 2 * len(data) + 64  # bounds the encoded size, even for random bytes
        k, offset = (k, offset + len(data)) if rest else (k + 1, 0)
        if used >= budget:
            nxt = [k, offset] if k < len(wanted) else None
            break
    doc = {"files": out, "next": nxt}
print("CR-OUT " + base64.b64encode(zlib.compress(json.dumps(doc).encode())).decode())
"""

# Runs in a fresh sandbox: unpacks the zip at argv[2] into argv[1], removes it, and prints the names it
# could not write (no space left, say) as one line "CR-FAILED <json list>".
_UNPACK = r"""
import json, os, sys, zipfile
root, bundle, failed = sys.argv[1], sys.argv[2], []
with zipfile.ZipFile(bundle) as z:
    members = z.infolist()
    os.unlink(bundle)
    for info in members:
        path = os.path.normpath(os.path.join(root, info.filename))
        try:
            if not path.startswith(root + os.sep):
                raise OSError("outside the workspace")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(z.read(info))
        except OSError:
            failed.append(info.filename)
print("CR-FAILED " + json.dumps(failed))
"""


def _sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


@contextmanager
def output_cap(sb: Sandbox) -> Iterator[int]:
    """Raise the sandbox's output cap for the harness's own reads (the agent is done): up to 8 MiB, half
    the largest file a command may write (bwrap's output is such a file); yields the cap in effect."""
    limits = getattr(sb, "limits", None)
    before = int(getattr(limits, "output_bytes", 64_000))
    fsize = int(getattr(limits, "fsize_mb", 64)) * 1024 * 1024
    cap = max(before, min(8 * 1024 * 1024, fsize // 2)) if limits is not None else before
    if limits is not None:
        limits.output_bytes = cap
    try:
        yield cap
    finally:
        if limits is not None:
            limits.output_bytes = before


def _run(sb: Sandbox, *args: str) -> dict[str, Any]:
    """Run `_SCRIPT` with ``args`` in ``sb``; its decoded answer. `SandboxError` if it gives none."""
    mode, limit, start, *rest = args
    with output_cap(sb) as cap:
        argv = ("python3", "-I", "-S", "-c", _SCRIPT, mode, sb.workdir, limit, str(cap // 2), start)
        r = sb.exec(" ".join(shlex.quote(a) for a in (*argv, *rest)), timeout=120)
    line = next((x for x in r.output.splitlines() if x.startswith("CR-OUT ")), None)
    try:
        if not r.ok or line is None:
            raise ValueError(f"exit {r.returncode}: {r.output.strip()[-300:]}")
        doc: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(line.split(" ", 1)[1])))
        return doc
    except (ValueError, zlib.error) as e:
        raise SandboxError(f"could not read the agent's workspace ({mode}): {e}") from e


def _list(sb: Sandbox, limit: int) -> tuple[list[list[Any]], bool]:
    entries: list[list[Any]] = []
    start: int | None = 0
    more = False
    while start is not None:
        doc = _run(sb, "list", str(limit), str(start))
        entries += doc["entries"]
        start, more = doc["next"], bool(doc["more"])
    return entries, more


def _read(sb: Sandbox, limit: int, indices: list[int]) -> dict[int, bytes]:
    parts: dict[int, list[bytes]] = {}
    at: list[int] | None = [0, 0]
    bits = bytearray((limit + 7) // 8)
    for i in indices:
        bits[i // 8] |= 1 << (i % 8)
    wanted = base64.b64encode(zlib.compress(bytes(bits))).decode()
    while at is not None and indices:
        doc = _run(sb, "read", str(limit), f"{at[0]}:{at[1]}", wanted)
        for k, _offset, data in doc["files"]:
            parts.setdefault(indices[k], []).append(base64.b64decode(data))
        at = doc["next"]
    return {i: b"".join(chunks) for i, chunks in parts.items()}


def read_changes(task: Task, sb: Sandbox) -> tuple[Changes, list[str]]:
    """``(changes, dropped)``: the agent's changes to ``task``'s files in ``sb`` (module docstring).

    ``changes`` maps a workspace-relative path to its new bytes, or None where a task file was deleted;
    ``dropped`` names what could not be carried (links leaving the workspace, special files, over the
    caps). Raises `SandboxError` when the sandbox cannot be read (an infrastructure failure).
    """
    limit = MAX_TASK_FILES + len(task.files)
    entries, more = _list(sb, limit)
    changes: Changes = {}
    dropped = [f"<more than {limit} files: the rest>"] if more else []
    listed = {e[0] for e in entries}
    wanted: list[int] = []
    budget = MAX_TASK_BYTES
    for index, (rel, kind, size, digest) in enumerate(entries):
        orig = task.files.get(rel)
        if kind in ("file", "link") and orig is not None and digest == _sha(orig):
            continue
        if kind not in ("file", "link") or len(wanted) >= MAX_TASK_FILES or size > budget:
            dropped.append(rel)
            if orig is not None:
                changes[rel] = None  # not there as the agent left it: it counts as deleted
            continue
        wanted.append(index)
        budget -= size
    for index, data in _read(sb, limit, wanted).items():
        changes[entries[index][0]] = data
    # task files the listing never reached (it stopped early) are left as the task has them
    changes.update({rel: None for rel in task.files if rel not in listed and not more})
    return changes, dropped


def put_files(sb: Sandbox, files: Mapping[str, bytes | str]) -> list[str]:
    """Write ``files`` (workspace-relative path -> content) into ``sb``: one by one where that is cheap
    (one file; up to 8 under bubblewrap, whose `put` is a host write), else as one zip unpacked inside
    (two commands whatever the count). Returns the paths that could not be written (no space left in
    the workspace, say); `SandboxError` if the sandbox fails."""
    if len(files) <= (8 if getattr(sb, "type", None) == "bwrap" else 1):
        for path, content in files.items():
            sb.put(path, content)
        return []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for path, content in files.items():
            z.writestr(path, content)
    bundle = f".cr-bundle-{_sha(buf.getvalue())}.zip"
    sb.put(bundle, buf.getvalue())
    argv = ("python3", "-I", "-S", "-c", _UNPACK, sb.workdir, f"{sb.workdir.rstrip('/')}/{bundle}")
    r = sb.exec(" ".join(shlex.quote(a) for a in argv), timeout=300)
    line = next((x for x in r.output.splitlines() if x.startswith("CR-FAILED ")), None)
    if not r.ok or line is None:
        raise SandboxError(f"could not unpack {len(files)} files in the sandbox: {r.output.strip()[-300:]}")
    failed: list[str] = json.loads(line.split(" ", 1)[1])
    return failed


def put_task_files(sb: Sandbox, task: Task) -> None:
    """Write ``task``'s files into ``sb`` (`put_files`); `SandboxError` when some do not fit."""
    failed = put_files(sb, task.files)
    if failed:
        raise SandboxError(
            f"task {task.name!r}: {len(failed)} of its files did not fit the sandbox: {failed[:3]}"
        )
