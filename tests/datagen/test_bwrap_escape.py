"""Bubblewrap-specific checks. The escape corpus itself - every attempt against every backend, limits,
keyrings, planted symlinks, the cleared environment - is parametrised over backends in tests/adversarial/."""

from __future__ import annotations

import shutil

import pytest

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.sandbox import SandboxError, SandboxLimits, make_sandbox
from composer_replication.datagen.seccomp import deny_filter

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture()
def sb():
    with BwrapSandbox(SandboxLimits(cpu_s=10, memory_mb=512, nproc=32, fsize_mb=8)) as s:
        yield s


def test_workspace_round_trip_and_tools_inside(sb):
    sb.put("pkg/mod.py", "VALUE = 41\n")
    r = sb.exec(
        "python3 -c 'import sys; sys.path.insert(0, \"pkg\"); import mod; print(mod.VALUE + 1)' > out.txt", 10
    )
    assert r.ok, r.output
    assert sb.get("out.txt") == b"42\n"
    assert sb.exec("python3 -m pytest --version", 20).ok  # pytest available for task tests


def test_threads_fork_and_subprocess_work_under_the_seccomp_filter(sb):
    code = (
        "import os, subprocess, threading\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "pid = os.fork()\n"
        "os._exit(7) if pid == 0 else print('child', os.waitpid(pid, 0)[1] >> 8)\n"
        "print(subprocess.run(['echo', 'sub'], capture_output=True, text=True).stdout.strip())\n"
    )
    sb.put("ok.py", code)
    r = sb.exec("python3 ok.py", 20)
    assert r.ok and r.output.split() == ["thread", "child", "7", "sub"], r.output


def test_command_argv_carries_the_filter_and_masks_proc_keys(sb):
    argv = sb.command_argv("true", seccomp_fd=9)
    assert argv[argv.index("--seccomp") + 1] == "9"
    assert "/proc/keys" in argv and "/proc/key-users" in argv
    assert len(deny_filter()) % 8 == 0 and len(deny_filter("aarch64")) % 8 == 0
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        deny_filter("riscv64")


def test_infra_failure_is_a_sandbox_error(tmp_path):
    with pytest.raises(SandboxError, match="bubblewrap"):
        with BwrapSandbox(bwrap=str(tmp_path / "no-bwrap")):
            pass
    with pytest.raises(ValueError, match="unknown sandbox type"):
        make_sandbox("vm")  # type: ignore[arg-type]


def test_given_workspace_is_kept_on_stop(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "seed.txt").write_text("seed\n")
    with BwrapSandbox(workspace=ws) as s:
        assert s.exec("cat seed.txt && echo made > made.txt", 10).ok
    assert (ws / "seed.txt").read_text() == "seed\n" and (ws / "made.txt").read_text() == "made\n"
