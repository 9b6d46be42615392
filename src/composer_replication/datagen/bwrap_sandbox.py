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
- **Limits**: as root with a writable cgroup file system, every command runs in its own memory +
  pids cgroup, so ``memory_mb`` (swap included) and ``nproc`` hold for **all its processes together**
  (`bwrap_limits.SandboxCgroup`); ``prlimit`` adds per-process CPU seconds, address space, file size,
  open files and no core dumps. The **wall clock** is enforced by the caller: the whole process group is
  killed, and with it the PID namespace (``--die-with-parent``, ``--new-session`` stop terminal and
  orphan tricks); the cgroup is emptied after every command.
- **Disk**: as root the workspace and ``/tmp`` are one tmpfs of ``workspace_mb`` mounted on the host
  (`bwrap_limits.TmpfsWorkspace`): everything the sandbox writes is capped together.
- **Kernel keyrings and namespaces**: a seccomp filter (`seccomp.deny_filter`) makes ``keyctl``,
  ``add_key``, ``request_key``, ``unshare``, ``setns`` and namespace-creating ``clone`` fail;
  ``/proc/keys`` and ``/proc/key-users`` read as empty.
- **put/get** refuse paths outside the workspace, including through symlinks the agent planted.

What is not covered:
- Kernel exploits: this is namespaces plus rlimits, not a VM (use docker with gVisor, or a microVM).
- Without root or without a writable cgroup file system (`containment` says which applies): memory
  is capped per process (RLIMIT_AS) and the process count per uid (RLIMIT_NPROC, shared by concurrent
  sandboxes), so a sandbox can hold up to ``memory_mb * nproc``; without root the workspace is a host
  directory whose size is checked after each command (``workspace_limit``), and ``/tmp`` a per-command
  tmpfs of ``workspace_mb``.
- CPU *fairness* between sandboxes (no cpu cgroup; ``cpu_s`` caps each process's CPU time).
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

from composer_replication.datagen import bwrap_limits
from composer_replication.datagen.sandbox_base import (
    ExecResult,
    SandboxContext,
    SandboxError,
    SandboxLimits,
    exec_result,
    safe_relpath,
)
from composer_replication.datagen.seccomp import deny_filter

WORKDIR = "/workspace"
# Only what the dynamic loader, Python and coreutils read. Notably absent: shadow, passwd, ssh, ssl keys.
_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
_MiB = 1024 * 1024


class BwrapSandbox(SandboxContext):
    """One workspace, many commands, each in a fresh bubblewrap sandbox (see module docstring).

    Args:
        limits: resource limits per command.
        workspace: an existing host directory to use as the workspace (kept on `stop`); default a
            fresh temporary directory (removed on `stop`).
        sandbox_uid: the unprivileged uid commands run as when the harness is root.
        python_prefix: a Python installation to expose read-only (default: the running interpreter's,
            so ``python3 -m pytest`` works inside); ``None`` exposes only ``/usr``.
        cgroups: whole-sandbox memory/pids limits through cgroups: None = where available, True =
            required (`SandboxError` if unavailable), False = per-process rlimits only.
        workspace_tmpfs: the workspace (and ``/tmp``) on one host tmpfs of ``workspace_mb``: None = when
            running as root, True = required, False = a plain directory checked after each command.
        ro_binds: host directories mounted read-only inside, ``{host: "/opt/..."}`` (a task's prepared
            environment; `sandbox_base.check_ro_binds`).

    ``containment`` (after `start`) names what holds here: ``{"memory": "cgroup-v1" | "cgroup-v2" |
    "rlimit-per-process", "workspace": "tmpfs" | "checked-after-each-command"}``.
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
        cgroups: bool | None = None,
        workspace_tmpfs: bool | None = None,
        ro_binds: dict[str, str] | None = None,
    ) -> None:
        super().__init__(limits, ro_binds)
        self._given_workspace = Path(workspace) if workspace is not None else None
        self.workspace: Path | None = None
        self.sandbox_uid = sandbox_uid
        self.python_prefix = python_prefix
        self.bwrap = bwrap
        self._as_root = os.geteuid() == 0
        self._want_cgroups, self._want_tmpfs = cgroups, workspace_tmpfs
        self._cgroup_mode: str | None = None
        self._tmpfs: bwrap_limits.TmpfsWorkspace | None = None
        self.containment: dict[str, str] = {}

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if shutil.which(self.bwrap) is None:
            raise SandboxError("bubblewrap not found: apt-get install bubblewrap (or use type='docker')")
        if self.workspace is not None:
            return
        self._cgroup_mode = None if self._want_cgroups is False else bwrap_limits.cgroup_mode()
        if self._want_cgroups and self._cgroup_mode is None:
            raise SandboxError("cgroups=True but no writable memory+pids cgroup here (needs root)")
        if self._want_tmpfs and not self._as_root:
            raise SandboxError("workspace_tmpfs=True needs a root harness (it mounts a tmpfs)")
        use_tmpfs = self._as_root if self._want_tmpfs is None else self._want_tmpfs
        if use_tmpfs:
            try:
                self._tmpfs = bwrap_limits.TmpfsWorkspace(self.limits.workspace_mb, self.sandbox_uid)
            except OSError as e:
                raise SandboxError(str(e)) from e
            self.workspace = self._tmpfs.workspace
            if self._given_workspace is not None and self._given_workspace.is_dir():
                bwrap_limits.copy_tree(self._given_workspace, self.workspace)
                for dirpath, dirnames, filenames in os.walk(self.workspace):
                    for name in dirnames + filenames:
                        os.lchown(os.path.join(dirpath, name), self.sandbox_uid, self.sandbox_uid)
        elif self._given_workspace is not None:
            self._given_workspace.mkdir(parents=True, exist_ok=True)
            self.workspace = self._given_workspace
        else:
            self.workspace = Path(tempfile.mkdtemp(prefix="cr-sandbox-"))
        self._chown(self.workspace)
        self.containment = {
            "memory": f"cgroup-{self._cgroup_mode}" if self._cgroup_mode else "rlimit-per-process",
            "workspace": "tmpfs" if self._tmpfs else "checked-after-each-command",
        }

    def stop(self) -> None:
        if self._tmpfs is not None:
            try:
                if self._given_workspace is not None and self.workspace is not None:
                    self._given_workspace.mkdir(parents=True, exist_ok=True)
                    bwrap_limits.copy_tree(self.workspace, self._given_workspace)
            finally:
                self._tmpfs.close()
                self._tmpfs = None
        elif self.workspace is not None and self._given_workspace is None:
            shutil.rmtree(self.workspace, ignore_errors=True)
        self.workspace = None

    # ----------------------------------------------------------------- command line
    def command_argv(self, cmd: str, seccomp_fd: int | None = None) -> list[str]:
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
        for outside, inside in self.ro_binds.items():
            for up in reversed(Path(inside).parents[:-1]):
                argv += ["--perms", "0755", "--dir", str(up)]
            argv += ["--ro-bind", outside, inside]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--ro-bind", "/dev/null", "/proc/keys", "--ro-bind", "/dev/null", "/proc/key-users"]
        if self._tmpfs is not None:
            argv += ["--bind", str(self._tmpfs.tmp), "/tmp"]
        else:
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
        ]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv += ["--"]
        if self._as_root:
            uid = str(self.sandbox_uid)
            argv += ["/usr/bin/setpriv", "--reuid", uid, "--regid", uid, "--clear-groups"]
            argv += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
        argv += [
            "/usr/bin/prlimit",
            f"--cpu={lim.cpu_s}:{lim.cpu_s + 1}",  # SIGXCPU at the soft limit, SIGKILL 1 s later
            f"--as={lim.memory_mb * _MiB}",
            # With a pids cgroup the process cap is per sandbox; RLIMIT_NPROC would be per uid (shared).
            *([] if self._cgroup_mode else [f"--nproc={lim.nproc}"]),
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
        t0 = time.monotonic()
        cgroup = None
        if self._cgroup_mode:
            try:
                cgroup = bwrap_limits.SandboxCgroup(
                    self.limits.memory_mb, self.limits.nproc, self._cgroup_mode
                )
            except OSError as e:
                raise SandboxError(f"could not create the sandbox cgroup: {e}") from e
        prefix = bwrap_limits.launcher(cgroup.procs_files) if cgroup else []
        seccomp_r, seccomp_w = os.pipe()  # bwrap reads the filter from this fd (224 bytes: fits the pipe)
        os.write(seccomp_w, deny_filter())
        os.close(seccomp_w)
        # Output goes to a host file: the child's RLIMIT_FSIZE caps it, so a flood cannot fill our memory.
        try:
            with tempfile.TemporaryFile() as out:
                try:
                    proc = subprocess.Popen(
                        prefix + self.command_argv(cmd, seccomp_fd=seccomp_r),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        pass_fds=(seccomp_r,),
                    )
                except OSError as e:
                    raise SandboxError(f"could not start bubblewrap: {e}") from e
                finally:
                    os.close(seccomp_r)
                timed_out = False
                try:
                    returncode = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    _kill_group(proc)
                    returncode = -1
                out.seek(0)
                raw = out.read(self.limits.output_bytes + 1)
            fired = cgroup.fired() if cgroup else []
        finally:
            if cgroup:
                cgroup.close()
        elapsed = time.monotonic() - t0
        r = exec_result(
            cmd, raw, returncode, timed_out=timed_out, elapsed=elapsed, output_bytes=self.limits.output_bytes,
            fired=fired,
        )  # fmt: skip
        if (returncode == 1 and r.output.startswith("bwrap:")) or (
            returncode == 125 and r.output.startswith("cr-cgroup:")
        ):
            raise SandboxError(f"bubblewrap failed to set up the sandbox: {r.output.strip() or returncode}")
        if self._tmpfs is None and self.workspace is not None:
            used = bwrap_limits.directory_bytes(self.workspace)
            if used > self.limits.workspace_mb * _MiB:
                r.violations.append("workspace_limit")
                r.output += (
                    f"\n[workspace holds {used // _MiB} MiB, over workspace_mb={self.limits.workspace_mb}]"
                )
                r.returncode = r.returncode or 1
        return r

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
        assert self.workspace is not None  # _host_path: started
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
