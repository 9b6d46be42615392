"""The escape corpus: one parametrised set of attempts, each run against every sandbox backend.

Every attempt must fail (non-zero exit) where failing is the point, leak no canary (file, environment
variable or kernel key), leave the host untouched and reach no host socket. The tripwire names are
checked separately (test_sandbox_tripwire.py): here only isolation counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from composer_replication.datagen.sandbox import SandboxError

SECRET = "canary-7f3a9c-do-not-leak"  # the value the escape_host fixture plants

PY = "python3 -c "

# name -> (command template, must exit non-zero). Templates see {canary}, {dir}, {port}, {docker_sock}.
CASES: dict[str, tuple[str, bool]] = {
    "network_out": (PY + "\"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"", True),
    "network_host_loopback": (
        PY + "\"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"",
        True,
    ),
    "network_host_ip": (
        PY
        + '"import socket; socket.create_connection((socket.gethostbyname(socket.gethostname()), {port}), timeout=2)"',
        True,
    ),
    "dns": (PY + "\"import socket; socket.getaddrinfo('pypi.org', 443)\"", True),
    "raw_socket": (
        PY + '"import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"',
        True,
    ),
    "read_canary": ("cat {canary}", True),
    "list_test_dir": ("ls {dir}", True),
    "read_root_home": ("ls -la /root && cat /root/.bashrc", True),
    "read_shadow": ("cat /etc/shadow", True),
    "write_outside": ("echo pwned > {dir}/pwned.txt", True),
    "write_usr": ("echo pwned > /usr/pwned.txt", True),
    "write_etc": ("touch /etc/pwned", True),
    "write_sys": ("echo 1 > /sys/kernel/mm/transparent_hugepage/enabled", True),
    "proc_pid1_environ": ("cat /proc/1/environ", False),  # the sandbox's own init at most: no canary
    "proc_all_environ": ("cat /proc/*/environ", False),
    "env_secret": ("env; cat /proc/self/environ", False),
    "docker_socket": ("ls -la /var/run/docker.sock", True),
    "docker_host_socket": ("test -S {docker_sock} && echo reachable", True),
    "mount_syscall": (
        PY
        + "\"import ctypes, sys; sys.exit(ctypes.CDLL(None).mount(b'none', b'/usr', b'tmpfs', 0, None) != 0)\"",
        True,
    ),
    "setuid_root": (PY + '"import os; os.setuid(0)"', True),
    "user_namespace": (
        PY + '"import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)"',
        True,
    ),
    "chroot_syscall": (PY + "\"import os; os.chroot('/tmp')\"", True),
    # exits 0 (an escape) only if a host process - this pytest run - is visible, hence signal-/ptrace-able
    "host_processes_visible": (
        PY
        + "\"import os, sys; sys.exit(0 if any(b'py' b'test' in open(f'/proc/{{p}}/cmdline', 'rb').read() for p in os.listdir('/proc') if p.isdigit()) else 1)\"",
        True,
    ),
}


def _fmt(template: str, host: dict) -> str:
    sock = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
    return template.format(canary=host["canary"], dir=host["dir"], port=host["port"], docker_sock=sock)


@pytest.mark.parametrize("case", sorted(CASES))
def test_escape_attempt_is_contained(sandbox_backend, escape_host, case):
    template, must_fail = CASES[case]
    sb = sandbox_backend()
    r = sb.exec(_fmt(template, escape_host), timeout=15)
    assert SECRET not in r.output, f"{case} leaked the canary through {sandbox_backend.backend}: {r.output!r}"
    if must_fail:
        assert r.returncode != 0 and not r.timed_out, (
            f"{case} succeeded under {sandbox_backend.backend}: {r.output!r}"
        )
    assert not escape_host["accepted"], "a sandboxed process reached the host's loopback server"
    d = escape_host["dir"]
    assert escape_host["canary"].read_text() == SECRET
    assert sorted(p.name for p in d.iterdir()) == ["host_canary.txt"]
    assert not Path("/usr/pwned.txt").exists() and not Path("/etc/pwned").exists()


def test_host_keyrings_are_unreachable(sandbox_backend, host_keys):
    """A key in the harness's session keyring and in uid 65534's user keyring cannot be read inside."""
    serials = host_keys["serials"]
    control = host_keys["control"]()
    assert host_keys["secret"] in control, (
        f"control: the probe must read the keys outside a sandbox: {control}"
    )
    sb = sandbox_backend()
    sb.put("probe.py", host_keys["probe"])
    r = sb.exec("python3 probe.py " + " ".join(map(str, serials)), timeout=15)
    assert r.returncode == 0, r.output
    assert host_keys["secret"] not in r.output, f"{sandbox_backend.backend} read a host key: {r.output}"
    assert host_keys["desc"] not in r.output, f"{sandbox_backend.backend} can see a host key: {r.output}"
    reads = [line.split() for line in r.output.splitlines() if line.startswith("read ")]
    assert len(reads) == len(serials) and all(int(fields[2]) == -1 for fields in reads), r.output


def test_planted_symlinks_cannot_leak_through_get_or_put(sandbox_backend, escape_host):
    sb = sandbox_backend()
    sb.exec(f"ln -s {escape_host['canary']} leak; ln -s /etc passwd_dir; ln -s /etc/hostname host", timeout=5)
    for path in ("leak", "host"):
        with pytest.raises(PermissionError):
            sb.get(path)
    with pytest.raises((PermissionError, SandboxError)):
        sb.put("passwd_dir/evil", "x")
    with pytest.raises(ValueError, match="relative"):
        sb.get("/etc/hostname")
    with pytest.raises(ValueError, match="'..'"):
        sb.put("../x", "y")
    assert escape_host["canary"].read_text() == SECRET
    assert not Path("/etc/evil").exists()


def test_environment_carries_no_parent_secret(sandbox_backend, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-" + SECRET)
    sb = sandbox_backend()
    r = sb.exec("env", 5)
    names = {line.split("=", 1)[0] for line in r.output.splitlines() if "=" in line}
    assert "OPENROUTER_API_KEY" not in names and SECRET not in r.output
