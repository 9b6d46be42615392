"""The adversarial corpus: hostile inputs and escape attempts, run in CI with the default suite.

Sandbox fixtures (``test_sandbox_*``): ``sandbox_backend`` is parametrised over every backend, so each
escape case runs against bubblewrap and Docker alike. A backend that cannot run here is skipped with
the reason, except when ``CR_REQUIRE_DOCKER=1`` (set by ``scripts/test.sh`` after it started dockerd):
then a missing daemon or image is a failure, never a silent skip.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from composer_replication.datagen.sandbox import SandboxLimits

SECRET = "canary-7f3a9c-do-not-leak"
KEY_DESC = "cr-adversarial-canary"
NOBODY = 65534
BACKENDS = ["bwrap", "docker"]
_SYS_ADD_KEY, _SYS_KEYCTL = 248, 250  # x86_64
_KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_REVOKE = 1, 3
_KEY_SPEC_SESSION_KEYRING, _KEY_SPEC_USER_KEYRING = -3, -4


def _docker_ready() -> str | None:
    """None when the docker backend can run here, else why not."""
    from composer_replication.datagen.docker_image import ensure_image
    from composer_replication.datagen.docker_sandbox import docker_available

    if not docker_available():
        return "no Docker daemon answers here (scripts/test.sh starts one: scripts/dockerd.sh)"
    try:
        ensure_image()
    except (RuntimeError, OSError) as e:
        pytest.fail(f"a Docker daemon answers but the sandbox image cannot be built: {e}")
    return None


@pytest.fixture(scope="session")
def _backend_status() -> dict[str, str | None]:
    status: dict[str, str | None] = {}
    status["bwrap"] = (
        None if shutil.which("bwrap") else "bubblewrap not installed (apt-get install bubblewrap)"
    )
    status["docker"] = _docker_ready()
    if status["docker"] and os.environ.get("CR_REQUIRE_DOCKER") == "1":
        pytest.fail(f"CR_REQUIRE_DOCKER=1 but {status['docker']}")
    return status


@pytest.fixture(params=BACKENDS)
def sandbox_backend(request, _backend_status):
    """A factory ``make(limits=None, **kw)`` of started sandboxes of one backend (stopped afterwards)."""
    name = request.param
    if _backend_status[name]:
        pytest.skip(f"{name} backend: {_backend_status[name]}")
    started = []

    def make(limits: SandboxLimits | None = None, **kw):
        from composer_replication.datagen.sandbox import make_sandbox

        sb = make_sandbox(
            name, limits=limits or SandboxLimits(cpu_s=10, memory_mb=512, nproc=32, fsize_mb=8), **kw
        )
        sb.start()
        started.append(sb)
        return sb

    make.backend = name  # type: ignore[attr-defined]
    yield make
    for sb in started:
        sb.stop()


@pytest.fixture()
def escape_host(tmp_path, monkeypatch):
    """Canary file and env secret, and a loopback TCP server on the host that must never be reached."""
    canary = tmp_path / "host_canary.txt"
    canary.write_text(SECRET)
    monkeypatch.setenv("CR_CANARY_API_KEY", SECRET)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield {
        "dir": tmp_path,
        "canary": canary,
        "port": srv.getsockname()[1],
        "accepted": accepted,
        "secret": SECRET,
    }
    stop.set()
    t.join()
    srv.close()


# ----------------------------------------------------------------------------- kernel keyrings
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def add_key(description: str, payload: str, keyring: int) -> int:
    serial = _libc().syscall(
        _SYS_ADD_KEY, b"user", description.encode(), payload.encode(), len(payload), ctypes.c_int(keyring)
    )
    if serial < 0:
        raise OSError(ctypes.get_errno(), f"add_key({description!r}) failed")
    return serial


KEY_PROBE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for serial in map(int, sys.argv[1:]):
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(250, 11, serial, buf, 256)  # KEYCTL_READ
    print("read", serial, n, ctypes.get_errno(), buf.raw[: max(n, 0)].decode(errors="replace"))
for ring in (-3, -4, -5):  # session, user, user-session keyrings
    found = libc.syscall(250, 10, ctypes.c_int(ring), b"user", b"%s", 0)  # KEYCTL_SEARCH
    print("search", ring, found, ctypes.get_errno())
    if found > 0:
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(250, 11, found, buf, 256)
        print("found", buf.raw[: max(n, 0)].decode(errors="replace"))
try:
    print(open("/proc/keys").read())
except OSError as e:
    print("proc-keys", e)
""".replace("%s", KEY_DESC)


@pytest.fixture()
def host_keys():
    """A secret key in this process's (new) session keyring and, as root, in uid 65534's user keyring.

    The sandbox user is 65534 in both backends, and user keyrings are per uid host-wide, so the second
    key is what a sandbox without a seccomp filter could read even without inheriting our session.
    Yields ``{"serials", "secret", "desc", "probe"}`` (``probe``: a Python script printing what it could read
    of the keys whose serials are its arguments) and ``control()``, the probe run as uid 65534 outside
    any sandbox; the keys are revoked afterwards.
    """
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        pytest.skip("the keyring probe uses x86_64 syscall numbers")
    libc = _libc()
    if libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        pytest.skip(f"keyrings unavailable here (errno {ctypes.get_errno()})")
    secret = SECRET + "-keyring"
    serials = [add_key(KEY_DESC, secret, _KEY_SPEC_SESSION_KEYRING)]
    nobody_serial = None
    if os.geteuid() == 0:
        code = (
            "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long; "
            f"print(libc.syscall(248, b'user', {KEY_DESC.encode()!r}, {secret.encode()!r}, {len(secret)}, "
            "ctypes.c_int(-4)))"
        )
        out = _as_nobody([sys.executable, "-c", code])
        nobody_serial = int(out.stdout.strip())
        assert nobody_serial > 0, out
        serials.append(nobody_serial)
    yield {
        "serials": serials,
        "secret": secret,
        "desc": KEY_DESC,
        "probe": KEY_PROBE,
        "control": lambda: probe_keys_unsandboxed(serials),
    }
    libc.syscall(_SYS_KEYCTL, _KEYCTL_REVOKE, ctypes.c_int(serials[0]))
    if nobody_serial:
        _as_nobody(
            [sys.executable, "-c", f"import ctypes; ctypes.CDLL(None).syscall(250, 3, {nobody_serial})"]
        )


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd="/")


def probe_keys_unsandboxed(serials: list[int]) -> str:
    """The key probe run as uid 65534 *outside* any sandbox: the control showing the probe can succeed."""
    return _as_nobody([sys.executable, "-c", KEY_PROBE, *map(str, serials)]).stdout


@pytest.fixture()
def sandbox_ps():
    """``(prefix, alive)``: prefix a command with ``prefix`` (it exports a unique marker that every child
    inherits); ``alive()`` lists the host processes still carrying it - for either backend, since a
    container's processes are host processes too. Exact even with other sandboxes running on the host."""
    marker = f"CR_SURVIVOR_MARK={uuid.uuid4().hex}"

    def alive() -> list[str]:
        found = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if marker.encode() in (d / "environ").read_bytes():
                        found.append(
                            f"{d.name} {(d / 'cmdline').read_bytes().replace(bytes(1), b' ').decode()}"
                        )
                except OSError:
                    continue
        return found

    return f"export {marker}; ", alive
