"""A sandboxed command that attacks its own sandbox: ``kill -9 -1``, killing the init and its child,
``ptrace`` on them. None of it may break the sandbox for the next command, and a rollout that tried
must still get a score (never an unscorable None). A container that stops anyway is an infrastructure
failure for that command and is replaced for the next one."""

from __future__ import annotations

import subprocess

import pytest

from composer_replication import wire
from composer_replication.datagen import docker_sandbox
from composer_replication.datagen.reward import make_shaped_reward
from composer_replication.datagen.sandbox import SandboxError, SandboxLimits, make_sandbox
from composer_replication.datagen.tasks import bundled_tasks

# Attaches to every process it can see; prints the init's children (docker: `sleep infinity`) first.
PTRACE_ALL = r"""python3 -c "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('children', open('/proc/1/task/1/children').read().strip() or '-')
for pid in sorted(int(p) for p in os.listdir('/proc') if p.isdigit()):
    if pid != os.getpid():
        print('attach', pid, libc.ptrace(16, pid, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
" """

ATTACKS = {
    "kill_all": "kill -9 -1",
    "kill_init_and_child": "kill -9 1; kill -9 $(cat /proc/1/task/1/children 2>/dev/null); true",
    "ptrace_everything": PTRACE_ALL,
    "stop_everything": "kill -STOP -1",  # its own wrapper and `timeout` included (same uid)
}


def _untouchable(output: str) -> list[str]:
    """The attach lines for the sandbox's init and the init's children: each must have failed."""
    lines = output.splitlines()
    kids = next((ln.split()[1:] for ln in lines if ln.startswith("children")), [])
    return [ln for ln in lines if ln.startswith("attach") and ln.split()[1] in ("1", *kids)]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_self_harm_leaves_the_sandbox_working(sandbox_backend, attack, monkeypatch):
    # docker: a command that stops its own wrapper hangs the exec until timeout + grace (15 s; 2 s here)
    monkeypatch.setattr(docker_sandbox, "_GRACE_S", 2.0)
    sb = sandbox_backend()
    sb.put("work.txt", "kept")
    r = sb.exec(ATTACKS[attack], timeout=3)
    if attack == "ptrace_everything":
        assert _untouchable(r.output) and all(ln.split()[2] == "-1" for ln in _untouchable(r.output)), (
            r.output
        )
    after = sb.exec("cat work.txt && echo alive", timeout=15)
    assert after.ok and after.output == "kept" + "alive\n", after.output
    assert getattr(sb, "restarts", 0) == 0


def test_docker_container_stopped_from_outside_is_an_infra_failure_then_replaced(sandbox_backend):
    if sandbox_backend.backend != "docker":
        pytest.skip("bubblewrap runs each command in a fresh sandbox: there is no container to lose")
    sb = sandbox_backend()
    sb.put("work.txt", "kept")
    # a command that prints the daemon's words is not taken for a stopped container (confirmed by inspect)
    fake = sb.exec("echo 'Error response from daemon: Container x is not running' >&2; exit 1", timeout=15)
    assert fake.returncode == 1 and sb.restarts == 0
    subprocess.run([sb.executable, "kill", sb.container_id], capture_output=True, timeout=60, check=True)
    with pytest.raises(SandboxError, match="container stopped.*infrastructure failure"):
        sb.exec("cat work.txt", timeout=15)
    with_fresh = sb.exec("ls -A; echo alive", timeout=15)
    assert with_fresh.ok and with_fresh.output == "alive\n" and sb.restarts == 1
    subprocess.run([sb.executable, "kill", sb.container_id], capture_output=True, timeout=60, check=True)
    with pytest.raises(SandboxError):
        sb.get("work.txt")  # reads hit it too: never taken for a missing file (an agent's mistake)


def test_a_rollout_that_attacks_its_sandbox_is_still_scored(sandbox_backend):
    task = bundled_tasks()["off_by_one"]
    limits = SandboxLimits(cpu_s=10, memory_mb=512, nproc=32, fsize_mb=8)
    reward = make_shaped_reward(
        {task.name: task}, sandbox_factory=lambda: make_sandbox(sandbox_backend.backend, limits=limits)
    )
    fix = wire.format_tool_use("Write", {"file_path": "mathx.py", "content": task.solution["mathx.py"]})
    harm = wire.format_tool_use("Bash", {"command": ATTACKS["kill_init_and_child"] + "; kill -9 -1"})
    out = reward(completions=[harm + "\n" + fix, harm], task=[task.name] * 2)
    assert None not in out and reward.stats.infra_errors == 0, reward.stats.errors
    # the fix still counts after the attack; the attack alone earns the untouched baseline (1 of 3 tests)
    assert reward.last_parts[0]["tests"] == 1.0 and reward.last_parts[1]["tests"] == pytest.approx(1 / 3)
