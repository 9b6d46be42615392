"""Escape corpus under bubblewrap: every attempt fails, is reported, and the host is untouched."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.sandbox import SandboxError, SandboxLimits, check_command, make_sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

SECRET = "canary-7f3a9c-do-not-leak"


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    pids.append(int(d.name))
            except FileNotFoundError:
                continue
    return pids


@pytest.fixture()
def host(tmp_path, monkeypatch):
    """Canary files outside the workspace, a canary env secret, and a loopback TCP server on the host."""
    canary = tmp_path / "host_canary.txt"
    canary.write_text(SECRET)
    monkeypatch.setenv("CR_CANARY_API_KEY", SECRET)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    accepted = []

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                accepted.append(conn)
            except OSError:
                continue

    stop = threading.Event()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield {"dir": tmp_path, "canary": canary, "port": srv.getsockname()[1], "accepted": accepted}
    stop.set()
    t.join()
    srv.close()


@pytest.fixture()
def sb():
    with BwrapSandbox(SandboxLimits(cpu_s=10, memory_mb=512, nproc=32, fsize_mb=8)) as s:
        yield s


def test_escape_corpus(sb, host):
    port, canary, d = host["port"], host["canary"], host["dir"]
    py = "python3 -c "
    attempts = {
        "network_out": py + "\"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"",
        "network_host_loopback": py
        + f"\"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"",
        "dns": py + "\"import socket; socket.getaddrinfo('pypi.org', 443)\"",
        "read_canary": f"cat {canary}",
        "list_test_dir": f"ls {d}",
        "read_root": "ls -la /root && cat /root/.bashrc",
        "read_shadow": "cat /etc/shadow",
        "write_outside": f"echo pwned > {d}/pwned.txt",
        "write_usr": "echo pwned > /usr/pwned.txt",
        "write_etc": "touch /etc/pwned",
        "proc_host_env": "cat /proc/1/environ",
        "env_secret": "env; cat /proc/self/environ",
        "docker_socket": "ls -la /var/run/docker.sock",
        "mount": "mount -t tmpfs none /usr",
        "setuid_back": py + '"import os; os.setuid(0)"',
    }
    for name, cmd in attempts.items():
        r = sb.exec(cmd, timeout=10)
        assert SECRET not in r.output, f"{name} leaked the canary: {r.output!r}"
        if name != "env_secret":
            assert r.returncode != 0, f"{name} succeeded: {r.output!r}"
    # Policy tripwires report the obvious attempts on top of the isolation that stopped them.
    assert "secrets" in check_command(attempts["read_shadow"])
    assert "mount" in check_command(attempts["mount"])
    assert "host_proc" in check_command(attempts["proc_host_env"])
    assert not host["accepted"], "a sandboxed process reached the host's loopback server"
    # The host is untouched.
    assert canary.read_text() == SECRET
    assert (
        not (d / "pwned.txt").exists()
        and not Path("/usr/pwned.txt").exists()
        and not Path("/etc/pwned").exists()
    )
    assert sorted(p.name for p in d.iterdir()) == ["host_canary.txt"]


def test_fork_bomb_is_contained(sb):
    script = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 5000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(3); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('fork refused after', n, e)\n"
    )
    sb.put("bomb.py", script)
    r = sb.exec("python3 bomb.py", timeout=20)
    assert "fork refused after" in r.output, r.output
    assert int(r.output.split("after")[1].split()[0]) < 32
    assert "nproc_limit" in r.violations
    shell = sb.exec(":(){ :|:& };: ; sleep 1", timeout=5)
    assert "fork_bomb" in shell.violations
    deadline = time.monotonic() + 10
    while _uid_processes(sb.sandbox_uid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _uid_processes(sb.sandbox_uid) == [], "sandbox processes survived"


def test_memory_bomb_is_contained(sb):
    r = sb.exec("python3 -c 'x = bytearray(2 * 1024**3); print(len(x))'", timeout=20)
    assert r.returncode != 0 and "memory_limit" in r.violations, r.output


def test_sleep_past_timeout_is_killed(sb):
    t0 = time.monotonic()
    r = sb.exec("sleep 60 & sleep 60; echo finished", timeout=1.5)
    assert r.timed_out and r.returncode == -1 and "timeout" in r.violations
    assert "finished" not in r.output
    assert time.monotonic() - t0 < 10
    deadline = time.monotonic() + 5
    while _uid_processes(sb.sandbox_uid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _uid_processes(sb.sandbox_uid) == []


def test_cpu_and_file_size_limits(sb):
    r = sb.exec('python3 -c \'open("big", "wb").write(b"x" * (64 * 1024 * 1024))\'', timeout=20)
    assert r.returncode != 0 and "fsize_limit" in r.violations, (r.returncode, r.output)
    with BwrapSandbox(SandboxLimits(cpu_s=1)) as tight:
        spin = tight.exec("python3 -c 'while True: pass'", timeout=30)
    assert spin.returncode != 0 and not spin.timed_out and "cpu_limit" in spin.violations, spin


def test_symlinks_cannot_leak_host_files_through_get_or_put(sb, host):
    sb.exec(f"ln -s {host['canary']} leak; ln -s /etc passwd_dir", timeout=5)
    with pytest.raises(PermissionError):
        sb.get("leak")
    with pytest.raises(PermissionError):
        sb.put("passwd_dir/evil", "x")
    with pytest.raises(ValueError, match="relative"):
        sb.get("/etc/hostname")
    with pytest.raises(ValueError, match="'..'"):
        sb.put("../x", "y")
    assert host["canary"].read_text() == SECRET


def test_workspace_round_trip_and_tools_inside(sb):
    sb.put("pkg/mod.py", "VALUE = 41\n")
    r = sb.exec(
        "python3 -c 'import sys; sys.path.insert(0, \"pkg\"); import mod; print(mod.VALUE + 1)' > out.txt", 10
    )
    assert r.ok, r.output
    assert sb.get("out.txt") == b"42\n"
    assert sb.exec("python3 -m pytest --version", 20).ok  # pytest available for task tests


def test_infra_failure_is_a_sandbox_error(tmp_path):
    with pytest.raises(SandboxError, match="bubblewrap"):
        with BwrapSandbox(bwrap=str(tmp_path / "no-bwrap")):
            pass
    with pytest.raises(ValueError, match="unknown sandbox type"):
        make_sandbox("vm")  # type: ignore[arg-type]


def test_environment_is_cleared(sb, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-" + SECRET)
    r = sb.exec("env", 5)
    names = {line.split("=", 1)[0] for line in r.output.splitlines() if "=" in line}
    assert "OPENROUTER_API_KEY" not in names and SECRET not in r.output
    assert os.environ["OPENROUTER_API_KEY"].endswith(SECRET)  # it really was set in the parent
