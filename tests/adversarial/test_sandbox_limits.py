"""Resource limits hold for the sandbox as a whole, on every backend, and the documented fallbacks hold too."""

from __future__ import annotations

import time

import pytest

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.sandbox import SandboxLimits

MiB = 1024 * 1024
# Each holder touches 200 MB, says so, holds it 3 s, then says it let go.
HOLDER = (
    "import sys, time\n"
    "x = b'\\x01' * (200 << 20)\n"
    "print('held', sys.argv[1], flush=True)\n"
    "time.sleep(3)\n"
    "print('released', sys.argv[1], flush=True)\n"
)
SIX_HOLDERS = "for i in 1 2 3 4 5 6; do python3 hold.py $i & done; wait"
# 301 MB in 10 MB files (each well under fsize_mb), stopping at the first failed write.
FILL_WORKSPACE = (
    "for i in $(seq 1 31); do head -c 10000000 /dev/zero > f$i || { echo write-failed-at $i; exit 1; }; done; "
    "echo wrote-all"
)


def _bwrap_is_whole_sandbox(sb) -> None:
    if getattr(sb, "type", "") == "bwrap" and sb.containment["memory"] == "rlimit-per-process":
        pytest.skip(
            "no writable cgroup here (not root, or cgroups read-only): the per-process fallback is what holds, "
            "tested by test_bwrap_fallback_is_per_process_with_a_process_cap"
        )


def test_memory_limit_holds_for_all_processes_together(sandbox_backend):
    """6 processes x 200 MB under memory_mb=256: at most one can hold its 200 MB at a time."""
    sb = sandbox_backend(SandboxLimits(memory_mb=256, nproc=64, cpu_s=30, fsize_mb=64))
    _bwrap_is_whole_sandbox(sb)
    sb.put("hold.py", HOLDER)
    r = sb.exec(SIX_HOLDERS, timeout=60)
    released = [ln for ln in r.output.splitlines() if ln.startswith("released")]
    assert len(released) <= 1, f"{len(released)} x 200 MB held together under memory_mb=256: {r.output}"
    assert "memory_limit" in r.violations, r


def test_the_same_work_fits_a_big_enough_limit(sandbox_backend):
    """The control: with room for all six, all six hold their 200 MB together."""
    sb = sandbox_backend(SandboxLimits(memory_mb=1800, nproc=64, cpu_s=30, fsize_mb=64))
    sb.put("hold.py", HOLDER)
    r = sb.exec(SIX_HOLDERS, timeout=60)
    assert sum(ln.startswith("released") for ln in r.output.splitlines()) == 6, r.output


def test_workspace_limit_holds_for_everything_written(sandbox_backend):
    """301 MB written to the workspace with workspace_mb=64 fails, and the workspace stays under the cap."""
    sb = sandbox_backend(SandboxLimits(workspace_mb=64, fsize_mb=64, cpu_s=30, memory_mb=512))
    r = sb.exec(FILL_WORKSPACE, timeout=60)
    assert "wrote-all" not in r.output and r.returncode != 0, r.output
    assert "workspace_limit" in r.violations, r
    used = sb.exec("du -sk /workspace | cut -f1", 10).output.strip()
    assert int(used) <= 64 * 1024 + 64, f"workspace holds {used} KiB over a 64 MiB cap"
    # /tmp is capped as well (bwrap as root: the same tmpfs as the workspace; docker: its own of that size)
    sb.exec("rm -f f*", 10)
    t = sb.exec("head -c 100000000 /dev/zero > /tmp/big || echo tmp-full", timeout=30)
    assert "tmp-full" in t.output, t.output


def test_bwrap_workspace_and_tmp_share_one_cap():
    with BwrapSandbox(SandboxLimits(workspace_mb=64, fsize_mb=64)) as sb:
        if sb.containment["workspace"] != "tmpfs":
            pytest.skip(
                "not root: the workspace is a host directory checked after each command (tested below)"
            )
        r = sb.exec("head -c 40000000 /dev/zero > /tmp/a && head -c 40000000 /dev/zero > b && echo both", 30)
        assert "both" not in r.output and r.returncode != 0, r.output


def test_bwrap_fallback_workspace_is_checked_after_each_command():
    """Without the tmpfs (non-root), a command that leaves the workspace over the cap fails, flagged."""
    with BwrapSandbox(SandboxLimits(workspace_mb=64, fsize_mb=64), workspace_tmpfs=False) as sb:
        assert sb.containment["workspace"] == "checked-after-each-command"
        r = sb.exec(FILL_WORKSPACE, timeout=60)
        assert r.returncode != 0 and "workspace_limit" in r.violations, r
        assert "over workspace_mb=64" in r.output
        sb.exec("rm -f f*", 10)
        ok = sb.exec("head -c 1000000 /dev/zero > small && echo fine", 10)
        assert ok.ok and "workspace_limit" not in ok.violations, ok


def test_bwrap_fallback_is_per_process_with_a_process_cap():
    """Without cgroups: each process is capped at memory_mb, and at most nproc processes run."""
    with BwrapSandbox(SandboxLimits(memory_mb=256, nproc=4, cpu_s=30, fsize_mb=64), cgroups=False) as sb:
        assert sb.containment["memory"] == "rlimit-per-process"
        one = sb.exec("python3 -c 'x = bytearray(300 << 20)'", 30)
        assert one.returncode != 0 and "memory_limit" in one.violations, one
        sb.put("hold.py", HOLDER)
        many = sb.exec(SIX_HOLDERS, timeout=60)
        held = sum(ln.startswith("held") for ln in many.output.splitlines())
        assert 1 <= held <= 4 and "nproc_limit" in many.violations, many


def test_fork_bomb_is_contained(sandbox_backend, sandbox_ps):
    sb = sandbox_backend(SandboxLimits(cpu_s=10, memory_mb=512, nproc=32, fsize_mb=8))
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
    prefix, alive = sandbox_ps
    sb.put("bomb.py", script)
    r = sb.exec(prefix + "python3 bomb.py", timeout=30)
    assert "fork refused after" in r.output, r.output
    assert int(r.output.split("after")[1].split()[0]) < 32
    assert "nproc_limit" in r.violations
    shell = sb.exec(prefix + ":(){ :|:& };: ; sleep 1", timeout=10)
    assert "fork_bomb" in shell.violations
    _no_survivors(alive)


def test_sleep_past_timeout_is_killed_with_its_children(sandbox_backend, sandbox_ps):
    sb = sandbox_backend()
    prefix, alive = sandbox_ps
    t0 = time.monotonic()
    r = sb.exec(prefix + "sleep 60 & sleep 60; echo finished", timeout=1.5)
    assert r.timed_out and r.returncode == -1 and "timeout" in r.violations
    assert "finished" not in r.output
    assert time.monotonic() - t0 < 15
    _no_survivors(alive)


def test_cpu_and_file_size_limits(sandbox_backend):
    sb = sandbox_backend(SandboxLimits(cpu_s=1, memory_mb=512, nproc=32, fsize_mb=8))
    big = sb.exec('python3 -c \'open("big", "wb").write(b"x" * (64 * 1024 * 1024))\'', timeout=20)
    assert big.returncode != 0 and "fsize_limit" in big.violations, (big.returncode, big.output)
    spin = sb.exec("python3 -c 'while True: pass'", timeout=30)
    assert spin.returncode != 0 and not spin.timed_out and "cpu_limit" in spin.violations, spin


def _no_survivors(alive) -> None:
    """Right after the command returned, nothing it started is left (a short grace for the kernel to reap)."""
    deadline = time.monotonic() + 2
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"sandbox processes survived: {left}"
