"""Whole-sandbox limits for the bubblewrap backend: a memory + pids cgroup per command, a size-capped workspace.

What is covered:
- `SandboxCgroup`: every command of a `BwrapSandbox` runs in a fresh cgroup (a child of the harness's
  own cgroup) whose **memory** limit (swap included) and **process count** hold for all the command's
  processes together. cgroup v1 (``memory`` + ``pids`` hierarchies, as on the CI machines) and cgroup v2
  (the unified hierarchy, when ``memory`` and ``pids`` are delegated to the harness's cgroup) are both
  supported. After the command, anything left in the cgroup is killed and the cgroup removed;
  `SandboxCgroup.fired` says which limit the kernel enforced (OOM kills, refused forks).
- `TmpfsWorkspace`: the workspace and the sandbox's ``/tmp`` are two directories of **one** tmpfs of
  ``workspace_mb`` (mounted on the host by the root harness), so everything a sandbox writes is capped
  together and persists across its commands. A mount left by a harness that was killed is unmounted
  by the next `TmpfsWorkspace` on the same host (the owner pid is part of the mount's path).

What is not covered (fallbacks, each stated in `docs/sandbox.md`): without a writable cgroup file
system (non-root, or v2 without delegated controllers) the limits are per process — ``memory_mb`` of
address space per process plus ``nproc`` processes for the sandbox uid — so a sandbox can hold up to
``memory_mb * nproc``; without root the workspace is a plain host directory, measured after every
command (a command that leaves it over ``workspace_mb`` fails with ``workspace_limit``), so a single
command can overshoot the cap until it ends.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_MiB = 1024 * 1024
_counter = itertools.count()


def _own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


def _mount_types() -> dict[str, str]:
    """mount point -> fs type, for the cgroup file systems."""
    out = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2"):
            out[point] = fstype
    return out


@functools.lru_cache(maxsize=1)
def cgroup_mode() -> str | None:
    """``"v2"``, ``"v1"`` or None: which whole-sandbox cgroup limits this process can set up here.

    Decided once per process by really creating (and removing) a limited cgroup.
    """
    mode = _cgroup_layout()
    if mode is None:
        return None
    try:
        SandboxCgroup(64, 8, mode).close()
    except OSError:
        return None
    return mode


def _cgroup_layout() -> str | None:
    if os.geteuid() != 0:
        return None
    mounts, own = _mount_types(), _own_cgroups()
    if mounts.get(str(CGROUP_ROOT)) == "cgroup2":
        base = CGROUP_ROOT / own.get("", "/").lstrip("/")
        try:
            enabled = (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None
        return "v2" if {"memory", "pids"} <= set(enabled) and os.access(base, os.W_OK) else None
    v1 = [CGROUP_ROOT / c / own.get(c, "/").lstrip("/") for c in ("memory", "pids")]
    if all(mounts.get(str(CGROUP_ROOT / c)) == "cgroup" for c in ("memory", "pids")):
        return "v1" if all(os.access(d, os.W_OK) for d in v1) else None
    return None


class SandboxCgroup:
    """One command's cgroup (see module docstring). ``procs_files`` go to the launcher; call `close` after."""

    def __init__(self, memory_mb: int, nproc: int, mode: str) -> None:
        self.mode = mode
        own = _own_cgroups()
        name = f"cr-sandbox-{os.getpid()}-{next(_counter)}"
        if mode == "v2":
            self.dirs = [CGROUP_ROOT / own[""].lstrip("/") / name]
        else:
            self.dirs = [CGROUP_ROOT / c / own.get(c, "/").lstrip("/") / name for c in ("memory", "pids")]
        try:
            for d in self.dirs:
                d.mkdir()
            limit = str(memory_mb * _MiB)
            if mode == "v2":
                d = self.dirs[0]
                (d / "memory.max").write_text(limit)
                if (d / "memory.swap.max").exists():
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(nproc))
            else:
                mem, pids = self.dirs
                (mem / "memory.limit_in_bytes").write_text(limit)
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    (mem / "memory.memsw.limit_in_bytes").write_text(limit)
                (pids / "pids.max").write_text(str(nproc))
        except OSError:
            self.close()
            raise

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def fired(self) -> list[str]:
        """``memory_limit`` when the kernel OOM-killed inside, ``nproc_limit`` when it refused a fork."""
        hits = []
        if self.mode == "v2":
            events = _kv(self.dirs[0] / "memory.events")
            pids = _kv(self.dirs[0] / "pids.events")
        else:
            events = _kv(self.dirs[0] / "memory.oom_control")
            pids = _kv(self.dirs[1] / "pids.events")
        if events.get("oom_kill", 0) > 0 or events.get("oom", 0) > 0:
            hits.append("memory_limit")
        if pids.get("max", 0) > 0:
            hits.append("nproc_limit")
        return hits

    def close(self) -> None:
        """Kill whatever is left inside, then remove the cgroup (retrying while the kernel reaps)."""
        deadline = time.monotonic() + 10
        for d in self.dirs:
            while d.exists():
                for pid in _pids(d):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    d.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)


def _kv(path: Path) -> dict[str, int]:
    try:
        pairs = (line.split() for line in path.read_text().splitlines())
        return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
    except OSError:
        return {}


def _pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def launcher(procs_files: list[str]) -> list[str]:
    """argv prefix that moves itself into the given cgroups, then ``exec``s the rest (exit 125 if it cannot)."""
    script = (
        'while [ "$1" != -- ]; do echo $$ 2>/dev/null > "$1" '
        '|| { echo "cr-cgroup: cannot join $1" >&2; exit 125; }; shift; done; shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "cr-cgroup", *procs_files, "--"]


# --------------------------------------------------------------------------- workspace
_MOUNT_RE = re.compile(r"cr-sandbox-(\d+)-[^/]+$")


def directory_bytes(root: Path) -> int:
    """Bytes allocated under ``root`` (without following symlinks)."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for fn in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, fn)).st_blocks * 512
    return total


class TmpfsWorkspace:
    """A tmpfs of ``size_mb`` mounted on the host holding ``workspace/`` and ``tmp/`` (module docstring)."""

    def __init__(self, size_mb: int, uid: int) -> None:
        _reap_stale_mounts()
        self.root = Path(tempfile.mkdtemp(prefix=f"cr-sandbox-{os.getpid()}-"))
        r = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={size_mb}m,mode=0755,nosuid,nodev",
                "cr-sandbox",
                self.root,
            ],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            self.root.rmdir()
            raise OSError(f"could not mount the workspace tmpfs: {r.stderr.strip()}")
        self.workspace, self.tmp = self.root / "workspace", self.root / "tmp"
        self.workspace.mkdir()
        self.tmp.mkdir(mode=0o1777)
        os.chmod(self.tmp, 0o1777)
        os.chown(self.workspace, uid, uid)

    def close(self) -> None:
        _unmount(self.root)


def _unmount(root: Path) -> None:
    r = subprocess.run(["umount", str(root)], capture_output=True)
    if r.returncode != 0:  # busy: detach now, freed when the last user goes
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
    with contextlib.suppress(OSError):
        root.rmdir()


def _reap_stale_mounts() -> None:
    """Unmount workspace tmpfs left by harnesses that no longer run (SIGKILL, power loss of the process)."""
    tmp = Path(tempfile.gettempdir()).resolve()
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        m = _MOUNT_RE.search(point)
        if fstype != "tmpfs" or not m or Path(point).parent != tmp:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            _unmount(Path(point))
        except PermissionError:
            continue


def copy_tree(src: Path, dst: Path) -> None:
    """Copy ``src`` into ``dst`` keeping symlinks as links (never following them)."""
    for item in src.iterdir():
        target = dst / item.name
        if item.is_dir() and not item.is_symlink():
            shutil.copytree(item, target, symlinks=True, dirs_exist_ok=True)
        elif item.is_symlink():
            target.unlink(missing_ok=True)
            target.symlink_to(os.readlink(item))
        else:
            shutil.copy2(item, target, follow_symlinks=False)


def process_cgroup_events(pid: int) -> dict[str, int]:
    """OOM kills and refused forks so far in the cgroup of host process ``pid`` (e.g. a container's init).

    ``{"oom_kill": n, "pids_max": m}``; empty when the host's cgroup files are not readable from here.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return {}
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            paths[c] = path.lstrip("/")
    if "memory" in paths:
        mem = _kv(CGROUP_ROOT / "memory" / paths["memory"] / "memory.oom_control")
        pids = _kv(CGROUP_ROOT / "pids" / paths.get("pids", "") / "pids.events")
    else:
        mem = _kv(CGROUP_ROOT / paths.get("", "") / "memory.events")
        pids = _kv(CGROUP_ROOT / paths.get("", "") / "pids.events")
    if not mem and not pids:
        return {}
    return {"oom_kill": mem.get("oom_kill", 0), "pids_max": pids.get("max", 0)}
