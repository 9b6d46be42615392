"""Bubblewrap sandbox: runs an agent's commands without any daemon (the default where docker is absent).

What is covered:
- **Network**: a fresh network namespace with only ``lo`` (no route out, no DNS).
- **Filesystem**: the host's system directories (``/usr`` and the Python prefix) are bound read-only;
  ``/etc`` holds only the loader and locale files; the only writable places are the workspace
  (bound read-write from a fresh host directory) and a size-capped private ``/tmp``. Host home
  directories, the test's tmp dirs, ``/etc/shadow`` and the Docker socket are simply absent.
- **Environment**: cleared (``--clearenv``); only PATH/HOME/LANG/TMPDIR are set, so parent secrets never
  reach the agent.
- **Identity**: when the harness runs as root, bwrap keeps the init user namespace (so RLIMIT_NPROC can
  apply — root is exempt from it) and the command drops to an unprivileged uid (65534 by default) with
  every capability removed and ``no_new_privs`` set, before anything the agent wrote runs. As a
  non-root user, bwrap's user namespace (``--unshare-all``) is used instead.
- **Limits** (``prlimit``): CPU seconds, address space, process count, file size, open files, no core
  dumps. The **wall clock** is enforced by the caller: the whole process group is killed, and with it
  the PID namespace (``--die-with-parent``, ``--new-session`` stop terminal and orphan tricks).
- **put/get** refuse paths outside the workspace, including through symlinks the agent planted.

What is not covered:
- Kernel exploits: this is namespaces plus rlimits, not a VM (use docker with gVisor, or a microVM).
- A disk quota: many files each under ``fsize`` can fill the workspace's file system.
- RLIMIT_NPROC counts every process of the sandbox uid on the host, so concurrent sandboxes share it.
- CPU/memory *fairness* between sandboxes (no cgroups here; cgroups v1 on the CI machines is read-only).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from composer_replication.datagen.sandbox import (
    ExecResult,
    SandboxError,
    SandboxLimits,
    check_command,
    safe_relpath,
    truncate_output,
)

WORKDIR = "/workspace"
# Only what the dynamic loader, Python and coreutils read. Notably absent: shadow, passwd, ssh, ssl keys.
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
_MiB = 1024 * 1024


def _limit_violations(output: str, returncode: int) -> list[str]:
    """Which resource limit (if any) visibly fired: used to *report* containment, not to enforce it."""
    hits = []
    if "MemoryError" in output or "Cannot allocate memory" in output or "std::bad_alloc" in output:
        hits.append("memory_limit")
    if "Resource temporarily unavailable" in output or "retry: fork" in output:
        hits.append("nproc_limit")
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or "CPU time limit" in output:
        hits.append("cpu_limit")
    if (
        returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ)
        or "File size limit" in output
        or "File too large" in output
    ):
        hits.append("fsize_limit")
    return hits


class BwrapSandbox:
    """One workspace, many commands, each in a fresh bubblewrap sandbox (see module docstring).

    Args:
        limits: resource limits per command.
        workspace: an existing host directory to use as the workspace (kept on `stop`); default a
            fresh temporary directory (removed on `stop`).
        sandbox_uid: the unprivileged uid commands run as when the harness is root.
        python_prefix: a Python installation to expose read-only (default: the running interpreter's,
            so ``python3 -m pytest`` works inside); ``None`` exposes only ``/usr``.
    """

    type = "bwrap"
    workdir = WORKDIR

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workspace: str | os.PathLike[str] | None = None,
        sandbox_uid: int = 65534,
        python_prefix: str | None = sys.base_prefix,
        bwrap: str = "bwrap",
    ) -> None:
        self.limits = limits or SandboxLimits()
        self._given_workspace = Path(workspace) if workspace is not None else None
        self.workspace: Path | None = None
        self.sandbox_uid = sandbox_uid
        self.python_prefix = python_prefix
        self.bwrap = bwrap
        self._as_root = os.geteuid() == 0

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if shutil.which(self.bwrap) is None:
            raise SandboxError("bubblewrap not found: apt-get install bubblewrap (or use type='docker')")
        if self.workspace is not None:
            return
        if self._given_workspace is not None:
            self._given_workspace.mkdir(parents=True, exist_ok=True)
            self.workspace = self._given_workspace
        else:
            self.workspace = Path(tempfile.mkdtemp(prefix="cr-sandbox-"))
        self._chown(self.workspace)

    def stop(self) -> None:
        if self.workspace is not None and self._given_workspace is None:
            shutil.rmtree(self.workspace, ignore_errors=True)
        self.workspace = None

    def __enter__(self) -> BwrapSandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- command line
    def command_argv(self, cmd: str) -> list[str]:
        """The exact argv that runs ``cmd`` (inspectable; tests and docs show it)."""
        assert self.workspace is not None, "call start() first"
        lim = self.limits
        argv = [self.bwrap, "--die-with-parent", "--new-session"]
        if self._as_root:
            # Keep the init user namespace so the kernel charges RLIMIT_NPROC to the sandbox uid
            # (a user namespace would leave kuid 0, which is exempt); setpriv drops to that uid below.
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
            argv += ["--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
        argv += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "sbin", "lib", "lib64", "lib32"):
            host = Path("/") / name
            if host.is_symlink():
                argv += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                argv += ["--ro-bind", str(host), f"/{name}"]
        argv += ["--perms", "0755", "--dir", "/etc"]
        for name in _ETC_FILES:
            if os.path.exists(f"/etc/{name}"):
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        path = "/usr/local/bin:/usr/bin:/bin"
        if self.python_prefix and not self.python_prefix.startswith("/usr"):
            prefix = Path(self.python_prefix)
            # Traverse-only parents (0711): e.g. /root exists but cannot be listed or read.
            for parent in reversed(prefix.parents[:-1]):
                argv += ["--perms", "0711", "--dir", str(parent)]
            argv += ["--ro-bind", str(prefix), str(prefix)]
            path = f"{prefix}/bin:{path}"
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", str(lim.workspace_mb * _MiB), "--perms", "1777", "--tmpfs", "/tmp"]
        argv += ["--bind", str(self.workspace), WORKDIR, "--chdir", WORKDIR]
        argv += ["--clearenv", "--setenv", "PATH", path, "--setenv", "HOME", WORKDIR]
        argv += ["--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
        # Third-party pytest plugins of the host Python (hypothesis, ...) cost seconds per test run.
        argv += [
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            "--setenv",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD",
            "1",
            "--",
        ]
        if self._as_root:
            uid = str(self.sandbox_uid)
            argv += ["/usr/bin/setpriv", "--reuid", uid, "--regid", uid, "--clear-groups"]
            argv += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        argv += [
            "/usr/bin/prlimit",
            f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}",  # SIGXCPU at the soft limit, SIGKILL 1 s later
            f"--as={lim.memory_mb * _MiB}",
            f"--nproc={lim.nproc}",
            f"--fsize={lim.fsize_mb * _MiB}",
            "--nofile=256",
            "--core=0",
            "--",
            "/bin/bash",
            "-c",
            cmd,
        ]
        return argv

    # ----------------------------------------------------------------- exec
    def exec(self, cmd: str, timeout: float = 30.0) -> ExecResult:
        """Run ``cmd`` with bash in the workspace; kill the whole process group after ``timeout`` s.

        Raises `SandboxError` when bubblewrap itself cannot set up the sandbox (an infra failure).
        """
        if self.workspace is None:
            raise SandboxError("sandbox not started: use `with make_sandbox(...) as sb:` or call start()")
        violations = check_command(cmd)
        t0 = time.monotonic()
        # Output goes to a host file: the child's RLIMIT_FSIZE caps it, so a flood cannot fill our memory.
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(
                    self.command_argv(cmd),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                raise SandboxError(f"could not start bubblewrap: {e}") from e
            timed_out = False
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                returncode = -1
            out.seek(0)
            raw = out.read(self.limits.output_bytes + 1)
        output = truncate_output(raw, self.limits.output_bytes)
        if returncode == 1 and output.startswith("bwrap:"):
            raise SandboxError(f"bubblewrap failed to set up the sandbox: {output.strip()}")
        if timed_out:
            violations.append("timeout")
        violations += _limit_violations(output, returncode)
        return ExecResult(output, returncode, timed_out, time.monotonic() - t0, violations)

    # ----------------------------------------------------------------- files
    def _host_path(self, path: str) -> Path:
        if self.workspace is None:
            raise SandboxError("sandbox not started")
        root = self.workspace.resolve()
        target = (root / safe_relpath(path)).resolve()
        # resolve() follows symlinks the agent may have planted (e.g. ``x -> /etc/shadow``).
        if target != root and root not in target.parents:
            raise PermissionError(f"sandbox path {path!r} resolves outside the workspace")
        return target

    def put(self, path: str, data: bytes | str) -> None:
        target = self._host_path(path)
        for parent in reversed(target.relative_to(self.workspace.resolve()).parents[:-1]):
            d = self.workspace.resolve() / parent
            d.mkdir(exist_ok=True)
            self._chown(d)
        payload = data.encode() if isinstance(data, str) else data
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        self._chown(target)

    def get(self, path: str) -> bytes:
        fd = os.open(self._host_path(path), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _chown(self, path: Path) -> None:
        if self._as_root:
            os.chown(path, self.sandbox_uid, self.sandbox_uid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
