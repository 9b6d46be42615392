#!/usr/bin/env python3
"""Overhead of the pipeline's skip check: hashing inputs/outputs, and a rerun where every stage is current.

    python3 benchmarks/bench_pipeline.py [--run-dir RUN] [--repeats 3]

1. ``hash_path`` over the default model's directory (~517 MB of safetensors) against ``sha256sum`` (coreutils)
   on the same files, side by side in the same invocation: the runner's hashing should run at disk/sha speed.
2. With ``--run-dir`` (a finished run), the wall time of ``composer-replication run`` when every stage is
   skipped, against the wall time of ``python3 -c "import composer_replication.pipeline.stages"`` (the
   import cost every invocation pays anyway).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _t(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    from composer_replication._io import hash_path
    from composer_replication.models import resolve_default_model

    model = resolve_default_model()
    files = sorted(str(f) for f in model.iterdir() if f.is_file())
    size = sum(Path(f).stat().st_size for f in files) / 1e6
    base = _t(lambda: subprocess.run(["sha256sum", *files], check=True, capture_output=True), a.repeats)
    ours = _t(lambda: hash_path(model), a.repeats)
    res = {"model_dir_mb": round(size, 1), "sha256sum_s": round(base, 3), "hash_path_s": round(ours, 3),
           "ratio_hash_path_over_sha256sum": round(ours / base, 2)}  # fmt: skip
    if a.run_dir:
        run = Path(a.run_dir)
        cfg = run / "bench-config.json"
        cfg.write_text(json.dumps(json.loads((run / "manifest.json").read_text())["config"]))
        imp = _t(
            lambda: subprocess.run(
                [sys.executable, "-c", "import composer_replication.pipeline.stages"], check=True
            ),
            a.repeats,
        )
        rerun = _t(lambda: subprocess.run([sys.executable, "-m", "composer_replication.cli.main", "run", str(cfg), "--out", str(run)],
                                          check=True, capture_output=True), a.repeats)  # fmt: skip
        res.update(
            import_s=round(imp, 3),
            skipped_rerun_s=round(rerun, 3),
            ratio_rerun_over_import=round(rerun / imp, 2),
        )
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
