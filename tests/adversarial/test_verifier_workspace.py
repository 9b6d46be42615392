"""A workspace built to break the verifier's reading of it: a tree thousands of levels deep, more files
than the cap, long random names, links out and in loops, unreadable files and directories, a full disk.
An infrastructure failure scores None (left out of training), so an agent that could cause one would
escape every bad score: each case must come back scored (here: solved, since the fix is in there too),
with what could not be carried named in ``dropped``, in seconds."""

from __future__ import annotations

import time

import pytest

from composer_replication.datagen import workspace
from composer_replication.datagen.sandbox import SandboxLimits, make_sandbox
from composer_replication.datagen.tasks import bundled_tasks
from composer_replication.datagen.verifier import verify

LIMITS = SandboxLimits(cpu_s=20, memory_mb=512, nproc=64, fsize_mb=8)
OBO = bundled_tasks()["off_by_one"]
PY = "python3 -c "

CLUTTER = {
    "deep_tree": (PY + '"import os\nfor i in range(3000):\n    os.mkdir(\'d\'); os.chdir(\'d\')\nopen(\'x\', \'w\')"', []),
    "more_files_than_the_cap": (
        PY + "\"import os\nos.mkdir('m')\nfor i in range(400):\n    open(f'm/{i:03d}', 'w').write(str(i))\"",
        ["<more than 302 files: the rest>", "m/299"],  # mathx.py and 299 of them: the cap of 300 changes
    ),
    "long_random_names": (
        PY + "\"import secrets\nfor i in range(60):\n    open(secrets.token_hex(100), 'w').write(secrets.token_hex(4000))\"",
        [],
    ),
    "links_loops_and_locks": (
        "ln -s /etc/passwd out; ln -s . loop; ln -s mathx.py alias.py; mkdir dd; echo s > dd/s; ln -s dd dl; "
        "chmod 000 dd/s dd mathx.py; mkfifo pipe 2>/dev/null || true",
        ["dl", "loop", "out"],
    ),
    "workspace_and_tmp_full": (
        "for i in $(seq 60); do head -c 7M /dev/zero > f$i.bin 2>/dev/null || break; done; "
        "for i in $(seq 60); do head -c 7M /dev/zero > /tmp/f$i.bin 2>/dev/null || break; done; true",
        None,  # which files fit depends on the tmpfs: checked below
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CLUTTER))
def test_hostile_workspace_is_still_scored(sandbox_backend, case, monkeypatch):
    monkeypatch.setattr(workspace, "MAX_TASK_FILES", 300)  # the cap, scaled down to keep this fast
    command, dropped = CLUTTER[case]
    sb = sandbox_backend(LIMITS)
    for path, content in OBO.files.items():
        sb.put(path, content)
    sb.put("mathx.py", OBO.solution["mathx.py"])
    r = sb.exec(command, timeout=120)
    # filling both under docker can run into the container's memory (tmpfs pages count): killed, fine
    assert r.returncode == 0 or case == "workspace_and_tmp_full", r.output
    t0 = time.monotonic()
    v = verify(OBO, sb, sandbox=lambda: make_sandbox(sandbox_backend.backend, limits=LIMITS))
    took = time.monotonic() - t0
    assert v.infra_error is None and v.solved and not v.hacked, v.to_dict()
    if dropped is None:  # files over the 32 MiB budget are dropped, the rest carried
        assert v.dropped and all(p.startswith("f") and p.endswith(".bin") for p in v.dropped)
    else:  # (a FIFO where mkfifo exists: bubblewrap has it, the docker image not)
        assert [p for p in v.dropped if p != "pipe"] == dropped
    assert took < 60, f"{case}: {took:.0f} s"
