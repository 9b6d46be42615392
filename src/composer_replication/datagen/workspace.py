"""What an agent changed in its sandbox's workspace, relative to the task's original files.

`read_changes(task, sb)` lists the workspace from inside the sandbox (after the agent's last command,
when none of its processes is left: both backends kill them after every command) with the system
Python in isolated mode (``python3 -I -S``: no site, no user site, no workspace on ``sys.path``, so no
file the agent wrote is imported). The listing (each entry's kind, size and SHA-256) comes back on
standard output, compressed, in as many commands as the sandbox's output cap needs, so a workspace the
agent filled or made read-only is listed all the same (entries it made unreadable are made readable
first); only files whose hash differs from the task's are read back (``Sandbox.get``). Symlinks are read through (their
content, never the link itself: a link leaving the workspace is dropped), FIFOs, sockets and devices are
dropped, and a task file that is gone, unreadable or no longer a regular file counts as deleted.
Changes beyond `tasks.MAX_TASK_FILES` files or `tasks.MAX_TASK_BYTES` bytes are dropped (by path order).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shlex
import zlib

from composer_replication.datagen.sandbox_base import Sandbox, SandboxError
from composer_replication.datagen.tasks import MAX_TASK_BYTES, MAX_TASK_FILES, Task

__all__ = ["Changes", "read_changes"]

Changes = dict[str, bytes | None]

# Runs inside the sandbox: argv = root, first entry, output budget. Prints one line "CR-LISTING <b64>" of
# zlib-compressed JSON {"entries": [[path, kind, size, sha256[:32]]...], "next": index or None}. Entries
# the sandbox user owns but cannot read (chmod 000) are made readable first: the agent is done.
_LISTER = r"""
import base64, hashlib, json, os, stat, sys, zlib
root, first, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def readable(path, bits):
    try:
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & bits != bits:
            os.chmod(path, st.st_mode | bits)
    except OSError:
        pass
names = []
readable(root, 0o500)
for d, dirs, files in os.walk(root):
    rel_d = os.path.relpath(d, root)
    for name in dirs:
        readable(os.path.join(d, name), 0o500)
    names += [os.path.normpath(os.path.join(rel_d, n)) for n in dirs if os.path.islink(os.path.join(d, n))]
    names += [os.path.normpath(os.path.join(rel_d, n)) for n in files]
names.sort()
def entry(rel):
    full = os.path.join(root, rel)
    try:
        rel.encode("utf-8")
        readable(full, 0o400)
        st = os.lstat(full)
    except (OSError, UnicodeEncodeError):
        return [rel.encode("utf-8", "replace").decode(), "special", 0, ""]
    if stat.S_ISLNK(st.st_mode):
        return [rel, "link", 0, ""]
    if not stat.S_ISREG(st.st_mode):
        return [rel, "special", 0, ""]
    h = hashlib.sha256()
    try:
        with os.fdopen(os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return [rel, "unreadable", 0, ""]
    return [rel, "file", st.st_size, h.hexdigest()[:32]]
out, i, size = [], first, 0
while i < len(names) and (not out or size < budget):
    out.append(entry(names[i]))
    size += len(out[-1][0]) // 2 + 40
    i += 1
blob = zlib.compress(json.dumps({"entries": out, "next": i if i < len(names) else None}).encode())
print("CR-LISTING " + base64.b64encode(blob).decode())
"""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _listing(sb: Sandbox) -> list[list]:
    """Every workspace entry, in as many commands as the sandbox's output cap needs."""
    cap = int(getattr(getattr(sb, "limits", None), "output_bytes", 64_000))
    entries: list[list] = []
    first: int | None = 0
    while first is not None:
        budget = max(cap // 2 - 200, 1)
        argv = ("python3", "-I", "-S", "-c", _LISTER, sb.workdir, str(first), str(budget))
        r = sb.exec(" ".join(shlex.quote(a) for a in argv), timeout=120)
        line = next((x for x in r.output.splitlines() if x.startswith("CR-LISTING ")), None)
        try:
            if not r.ok or line is None:
                raise ValueError(f"exit {r.returncode}: {r.output.strip()[-300:]}")
            data = json.loads(zlib.decompress(base64.b64decode(line.split(" ", 1)[1])))
        except (ValueError, zlib.error) as e:
            raise SandboxError(f"could not list the agent's workspace: {e}") from e
        entries += data["entries"]
        first = data["next"]
        if len(entries) > 4 * MAX_TASK_FILES:
            entries.append([f"<more than {4 * MAX_TASK_FILES} entries>", "special", 0, ""])
            break
    return entries


def read_changes(task: Task, sb: Sandbox) -> tuple[Changes, list[str]]:
    """``(changes, dropped)``: the agent's changes to ``task``'s files in ``sb`` (module docstring).

    ``changes`` maps a workspace-relative path to its new bytes, or None where a task file was deleted;
    ``dropped`` names what could not be carried (links leaving the workspace, special files, over the
    caps). Raises `SandboxError` when the sandbox cannot be listed (an infrastructure failure).
    """
    entries = _listing(sb)
    truncated = entries[-1][0].startswith("<more than") if entries else False
    changes: Changes = {}
    dropped: list[str] = []
    files, budget = 0, MAX_TASK_BYTES

    def refuse(rel: str) -> None:
        dropped.append(rel)
        if rel in task.files:
            changes[rel] = None  # the task's file is not there as the agent left it: it counts as deleted

    for rel, kind, size, digest in entries:
        orig = task.files.get(rel)
        if kind == "file" and orig is not None and digest == _sha(orig):
            continue
        if kind not in ("file", "link") or files >= MAX_TASK_FILES or size > budget:
            refuse(rel)
            continue
        try:
            data = sb.get(rel)
        except (OSError, ValueError):
            refuse(rel)
            continue
        if len(data) > budget:
            refuse(rel)
            continue
        files, budget = files + 1, budget - len(data)
        changes[rel] = data
    if not truncated:
        seen = {e[0] for e in entries}
        changes.update({rel: None for rel in task.files if rel not in seen})
    return changes, dropped
