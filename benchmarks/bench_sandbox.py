"""Sandbox overhead: one command under bubblewrap vs the same command as a plain subprocess, side by side.

    python3 benchmarks/bench_sandbox.py [--reps 20]

Prints a markdown table of median wall times and the ratio sandbox / plain for each command.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from composer_replication.datagen.bwrap_sandbox import BwrapSandbox
from composer_replication.datagen.tasks import bundled_tasks

COMMANDS = {
    "true": "true",
    "python3 -c pass": "python3 -c pass",
    "task tests (pytest, off_by_one)": None,  # filled with the task's test command
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    reps = p.parse_args().reps
    task = bundled_tasks()["off_by_one"]
    COMMANDS["task tests (pytest, off_by_one)"] = task.test_command
    rows = []
    with BwrapSandbox() as sb:
        for path, content in {**task.files, **task.solution}.items():
            sb.put(path, content)
        env = {
            "PATH": f"{sys.base_prefix}/bin:/usr/bin:/bin",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name, cmd in COMMANDS.items():
            plain, boxed = [], []
            for _ in range(reps):  # interleaved so that machine load hits both alike
                t0 = time.perf_counter()
                subprocess.run(
                    ["/bin/bash", "-c", cmd], cwd=sb.workspace, env=env, capture_output=True, check=True
                )
                plain.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                assert sb.exec(cmd, timeout=60).ok
                boxed.append(time.perf_counter() - t0)
            rows.append((name, statistics.median(plain), statistics.median(boxed)))
    print(f"| command | plain subprocess (median s) | bwrap sandbox (median s) | ratio |  (reps={reps})")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.4f} | {b:.4f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
