"""Docker (or podman) sandbox, driven through the CLI as mini-swe-agent does; re-exports the protocol.

What is covered:
- One long-lived container per sandbox (``docker run -d ... sleep infinity``), each command through
  ``docker exec``; the container has **no network** (``--network none``), a **read-only root**
  (``--read-only``), a **tmpfs workspace** and ``/tmp`` (``workspace_mb`` each, ``noexec`` off so tests
  can run; tmpfs pages count against the container's memory and outlive commands, so each is capped
  at ``(memory_mb - 128) / 2`` too: filling both leaves 128 MiB for the next command), CPU / memory /
  swap / **pids** limits for
  the container as a whole, a **non-root user** for every command (``docker exec --user 65534:65534``)
  while the container's init and its ``sleep infinity`` run as a different uid (0, with no
  capabilities), so a command cannot signal or ``ptrace`` them (``kill -9 -1`` ends only its own
  processes), **all capabilities dropped**,
  ``no-new-privileges``, ulimits for file size and open files, and the daemon's **default seccomp
  profile** (which denies ``keyctl``/``add_key``/``request_key`` and namespace creation; `start` refuses
  a daemon that reports no seccomp support). Docker masks ``/proc/keys`` and runs every container
  with its own session keyring.
- After every command, whatever it left running is killed by the same ``docker exec`` (all but the
  container's init, which reaps them (``--init``), and its ``sleep infinity``), as in the bubblewrap
  backend; OOM kills and refused forks are read from
  the container's cgroup on the host and reported as ``memory_limit`` / ``nproc_limit``.
- The default image is built locally by `docker_image.ensure_image` (no registry).
- Wall clock: each command runs under ``timeout --signal=KILL`` *inside* the container (the agent's
  timeout: ``timed_out=True``). A command that stops or traces its own ``timeout`` and wrapper (they
  share its uid) hangs the ``docker exec``: past the timeout plus a grace period every process of the
  sandbox user is killed and the command counts as timed out; only if the container does not answer
  that does the harness raise `SandboxError` (an infra failure, never a reward of 0).
- A container that stops anyway (the daemon, the OOM killer) is detected on the next command (the
  daemon's error, confirmed with ``docker inspect``, so a command printing that error fakes nothing):
  that command raises `SandboxError` (the rollout is an infrastructure failure, never scored) and a
  fresh container replaces it for the commands after (``restarts`` counts them; the workspace is lost).
- Files go in and out through ``docker exec -i`` + ``cat`` (``docker cp`` cannot write into tmpfs).
- ``executable="podman"`` uses the same flags (podman accepts them).

What is not covered:
- Image pulls: the image must already be present (CI machines cannot pull; build the default with
  ``python3 -m composer_replication.datagen.docker_image``).
- Kernel isolation beyond namespaces and seccomp: use ``runtime="runsc"`` (gVisor) when installed.
- Live tests need a daemon; on machines without one the tests check the exact argv only.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import time
import uuid

from composer_replication.datagen.bwrap_limits import process_cgroup_events
from composer_replication.datagen.docker_image import SANDBOX_IMAGE
from composer_replication.datagen.sandbox_base import (  # re-exported: the §16 module is the protocol's home
    ExecResult,
    Sandbox,
    SandboxContext,
    SandboxError,
    SandboxLimits,
    exec_result,
    safe_relpath,
)

__all__ = [
    "DockerSandbox",
    "ExecResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "docker_available",
    "image_present",
]

WORKDIR = "/workspace"
# Runs every command: `timeout` kills it at the deadline, then everything it left behind is killed - all
# but the container's init (pid 1), its `sleep infinity` ($1) and this shell - so nothing outlives a
# command (and docker exec does not wait on a background child holding stdout). Keeps the exit code.
_WRAP = (
    # (the shell's own "Killed" notice goes to /dev/null; the command's stderr to the caller's, via fd 3)
    'exec 3>&2 2>/dev/null; timeout --signal=KILL "$2" bash -c "$3" 2>&3 3>&-; rc=$?; keep=" 1 $1 $$ "; '
    "for p in /proc/[0-9]*; do "
    'p=${p#/proc/}; case "$keep" in *" $p "*) ;; *) kill -9 "$p" 2>/dev/null;; esac; done; exit $rc'
)
_HEADROOM_MB = 128  # container memory the two tmpfs mounts can never take (see run_argv)
_GRACE_S = 15.0  # extra seconds the docker CLI gets beyond the in-container timeout before it is "infra"
# What the daemon says when the container is gone (then confirmed with `inspect`).
_GONE = (b"is not running", b"No such container", b"cannot exec in a stopped", b"Error response from daemon")


@functools.lru_cache(maxsize=4)
def docker_available(executable: str = "docker") -> bool:
    """True when ``executable`` exists and a daemon answers ``info`` within 5 s."""
    if shutil.which(executable) is None:
        return False
    try:
        r = subprocess.run([executable, "info"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


_PRESENT: set[tuple[str, str]] = set()


def image_present(image: str = SANDBOX_IMAGE, executable: str = "docker") -> bool:
    """True when ``image`` is in the daemon's local store (remembered once seen)."""
    if (executable, image) in _PRESENT:
        return True
    try:
        r = subprocess.run([executable, "image", "inspect", image], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if r.returncode == 0:
        _PRESENT.add((executable, image))
    return r.returncode == 0


@functools.lru_cache(maxsize=4)
def _daemon_has_seccomp(executable: str) -> bool:
    """Whether the engine applies a seccomp profile (docker: SecurityOptions; podman: Host.Security)."""
    podman = os.path.basename(executable).startswith("podman")
    fmt = "{{.Host.Security.SECCOMPEnabled}}" if podman else "{{json .SecurityOptions}}"
    r = subprocess.run([executable, "info", "--format", fmt], capture_output=True, text=True, timeout=30)
    if podman:
        return r.stdout.strip() == "true"
    try:
        return any("seccomp" in opt for opt in json.loads(r.stdout or "null") or [])
    except ValueError:
        return False


class DockerSandbox(SandboxContext):
    """A container with a tmpfs workspace (see module docstring).

    Args:
        limits: resource limits (``cpu_s`` becomes ``--cpus`` = 1 and an RLIMIT_CPU ulimit).
        image: a locally present image with ``bash`` and ``timeout`` (coreutils); default the one
            `docker_image.ensure_image` builds from this host's Python.
        executable: ``"docker"`` or ``"podman"``.
        runtime: an OCI runtime such as ``"runsc"`` (gVisor), or None for the default.
        cpus: ``--cpus`` for the container.
        ro_binds: host directories mounted read-only inside, ``{host: "/opt/..."}``
            (`sandbox_base.check_ro_binds`).
    """

    type = "docker"
    workdir = WORKDIR

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        image: str = SANDBOX_IMAGE,
        executable: str = "docker",
        runtime: str | None = None,
        cpus: float = 1.0,
        user: str = "65534:65534",
        ro_binds: dict[str, str] | None = None,
    ) -> None:
        super().__init__(limits, ro_binds)
        self.image = image
        self.executable = executable
        self.runtime = runtime
        self.cpus = cpus
        self.user = user
        self.name = f"cr-sandbox-{uuid.uuid4().hex[:12]}"
        self.container_id: str | None = None
        self._init_pid: int | None = None
        self._main_pid = "0"
        self.restarts = 0  # containers found stopped and replaced (see module docstring)

    # ----------------------------------------------------------------- argv builders (pure)
    def run_argv(self) -> list[str]:
        """The ``docker run`` argv that starts the sandbox container."""
        lim = self.limits
        uid, _, gid = self.user.partition(":")
        mb = 1024 * 1024
        # --init: a reaper as pid 1, so killed orphans do not pile up as zombies against --pids-limit.
        # The init and `sleep infinity` run as uid 0 without capabilities: the commands (exec --user) cannot
        # signal or ptrace them. --init: a reaper as pid 1, so killed orphans do not pile up as zombies.
        argv = [self.executable, "run", "-d", "--rm", "--init", "--name", self.name, "--user", "0:0"]
        argv += ["--network", "none", "--read-only", "--workdir", WORKDIR]
        # tmpfs pages are the container's memory and outlive every command: the two mounts together leave
        # at least _HEADROOM_MB, so a full workspace and /tmp never stop the next command from starting.
        size = min(lim.workspace_mb, max((lim.memory_mb - _HEADROOM_MB) // 2, 16))
        argv += ["--tmpfs", f"{WORKDIR}:rw,exec,size={size}m,uid={uid},gid={gid or uid},mode=0755"]
        argv += ["--tmpfs", f"/tmp:rw,exec,size={size}m,mode=1777"]
        argv += [
            "--cpus",
            str(self.cpus),
            "--memory",
            f"{lim.memory_mb}m",
            "--memory-swap",
            f"{lim.memory_mb}m",
        ]
        argv += ["--pids-limit", str(lim.nproc), "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        argv += ["--ulimit", f"fsize={lim.fsize_mb * mb}:{lim.fsize_mb * mb}", "--ulimit", "nofile=256:256"]
        # SIGXCPU at the soft limit (reported as cpu_limit), SIGKILL a second later
        argv += ["--ulimit", f"cpu={lim.cpu_s}:{lim.cpu_s + 1}", "--ulimit", "core=0:0"]
        argv += ["--env", "HOME=" + WORKDIR, "--env", "PYTHONDONTWRITEBYTECODE=1"]
        argv += ["--env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"]
        for host, inside in self.ro_binds.items():
            argv += ["--mount", f"type=bind,source={host},target={inside},readonly"]
        if self.runtime:
            argv += ["--runtime", self.runtime]
        argv += [self.image, "sleep", "infinity"]
        return argv

    def exec_argv(self, cmd: str, timeout: float, *, stdin: bool = False) -> list[str]:
        """The ``docker exec`` argv for one command under an in-container ``timeout --signal=KILL``."""
        target = self.container_id or self.name
        argv = [self.executable, "exec"] + (["-i"] if stdin else []) + ["-u", self.user, "-w", WORKDIR]
        argv.append(target)
        return argv + ["bash", "-c", _WRAP, "cr-exec", self._main_pid, f"{timeout:g}", cmd]

    def stop_argv(self) -> list[str]:
        return [self.executable, "rm", "-f", self.container_id or self.name]

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.container_id is not None:
            return
        if not docker_available(self.executable):
            raise SandboxError(
                f"{self.executable} daemon not reachable; use type='bwrap' where there is no daemon"
            )
        if not _daemon_has_seccomp(self.executable):
            raise SandboxError(
                f"the {self.executable} daemon reports no seccomp support: sandboxed commands could reach "
                "the kernel keyrings; use a daemon with seccomp, or type='bwrap'"
            )
        r = subprocess.run(self.run_argv(), capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SandboxError(f"{self.executable} run failed: {r.stderr.strip()}")
        self.container_id = r.stdout.strip()
        pid = subprocess.run(
            [self.executable, "inspect", "--format", "{{.State.Pid}}", self.container_id],
            capture_output=True,
            text=True,
            timeout=30,
        )
        self._init_pid = int(pid.stdout.strip()) if pid.stdout.strip().isdigit() else None
        # The container's `sleep infinity` (the init's only child now) is spared by the per-command kill.
        argv = [self.executable, "exec", self.container_id, "cat", "/proc/1/task/1/children"]
        main = subprocess.run(argv, capture_output=True, timeout=30)
        self._main_pid = main.stdout.decode().split()[0] if main.stdout.split() else "0"

    def _reap(self) -> bool:
        """``kill -9 -1`` as the sandbox user (never reaches the init); True when the container answered."""
        argv = [self.executable, "exec", "-u", self.user, self.container_id or "", "bash", "-c", "kill -9 -1"]
        try:
            r = subprocess.run(argv, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode in (0, 1) and not self._stopped(r)

    def _stopped(self, r: subprocess.CompletedProcess[bytes]) -> bool:
        """Whether the container is gone: the daemon's error, confirmed by ``inspect`` (a command can print
        the same words)."""
        if r.returncode == 0 or not any(m in r.stderr for m in _GONE):
            return False
        probe = [self.executable, "inspect", "--format", "{{.State.Running}}", self.container_id or ""]
        try:
            state = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return True
        return state.stdout.strip() != "true"

    def _replace(self, r: subprocess.CompletedProcess[bytes]) -> SandboxError:
        """Start a fresh container for the next command; the error for this one."""
        why = r.stderr.decode(errors="replace").strip()[-300:]
        self.stop()
        self.restarts += 1
        try:
            self.start()
        except (SandboxError, OSError, subprocess.SubprocessError) as e:
            return SandboxError(f"the sandbox container stopped ({why}) and could not be replaced: {e}")
        return SandboxError(
            f"the sandbox container stopped ({why}); a fresh one (empty workspace) replaces it for the next "
            "command, and this run is an infrastructure failure"
        )

    def stop(self) -> None:
        if self.container_id is not None:
            subprocess.run(self.stop_argv(), capture_output=True, timeout=60)
            self.container_id = None

    # ----------------------------------------------------------------- exec and files
    def _run(
        self, argv: list[str], timeout: float, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        if self.container_id is None:
            raise SandboxError("sandbox not started: use `with make_sandbox('docker') as sb:`")
        try:
            r = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout + _GRACE_S)
        except subprocess.TimeoutExpired as e:
            # A command can stop or trace its own `timeout` and wrapper (same uid): end every process of
            # the sandbox user, then it is the command's timeout (137), not the sandbox's failure.
            if not self._reap():
                raise SandboxError(f"{self.executable} exec hung for {timeout + _GRACE_S:.0f} s") from e
            note = b"\n[the command stopped its own wrapper; every process of the sandbox user was killed]"
            return subprocess.CompletedProcess(argv, 137, e.stdout or b"", (e.stderr or b"") + note)
        if self._stopped(r):
            raise self._replace(r)
        return r

    def _events(self) -> dict[str, int]:
        return process_cgroup_events(self._init_pid) if self._init_pid else {}

    def exec(self, cmd: str, timeout: float = 30.0) -> ExecResult:
        t0 = time.monotonic()
        before = self._events()
        r = self._run(self.exec_argv(cmd, timeout), timeout)
        # 137 = SIGKILL from `timeout --signal=KILL`; 125/126 from docker itself mean the exec never ran.
        if r.returncode in (125,) or b"No such container" in r.stderr:
            raise SandboxError(f"{self.executable} exec failed: {r.stderr.decode(errors='replace').strip()}")
        elapsed = time.monotonic() - t0
        after = self._events()
        timed_out = r.returncode == 137 and elapsed >= timeout * 0.95
        counters = (("oom_kill", "memory_limit"), ("pids_max", "nproc_limit"))  # cgroup event -> the limit
        fired = [limit for key, limit in counters if after.get(key, 0) > before.get(key, 0)]
        return exec_result(
            cmd, r.stdout + r.stderr, r.returncode, timed_out=timed_out, elapsed=elapsed,
            output_bytes=self.limits.output_bytes, fired=fired,
        )  # fmt: skip

    def put(self, path: str, data: bytes | str) -> None:
        rel = shlex.quote(safe_relpath(path))
        payload = data.encode() if isinstance(data, str) else data
        cmd = f'mkdir -p -- "$(dirname -- {rel})" && cat > {rel}'
        r = self._run(self.exec_argv(cmd, 60, stdin=True), 60, stdin=payload)
        if r.returncode != 0:
            raise SandboxError(f"put {path!r} failed: {r.stderr.decode(errors='replace').strip()}")

    def get(self, path: str) -> bytes:
        rel = shlex.quote(safe_relpath(path))
        # realpath check inside the container: refuse symlinks that leave the workspace.
        cmd = f'p=$(realpath -m -- {rel}) && case "$p" in {WORKDIR}/*) cat -- "$p";; *) exit 3;; esac'
        r = self._run(self.exec_argv(cmd, 60), 60)
        if r.returncode == 3:
            raise PermissionError(f"sandbox path {path!r} resolves outside the workspace")
        if r.returncode != 0:
            raise FileNotFoundError(f"sandbox path {path!r}: {r.stderr.decode(errors='replace').strip()}")
        return r.stdout
