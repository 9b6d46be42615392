"""Ingestion throughput vs the raw line-parse rate, and peak memory vs the number of sessions.

Builds a corpus by copying the real logs of tests/data/sessions into N project folders (dedup is per project
folder, so every copy is ingested), then in one invocation measures, on the same files:

* raw parse: ``json.loads`` and ``orjson.loads`` of every line (MB/s of input);
* ``ingest_paths`` (parse + branch resolution + redaction + states/traces written), redaction on and off;
* peak RSS of a fresh process ingesting 1x, 4x and 16x the sessions.

Usage: python3 benchmarks/bench_ingest.py [--unit-mb 12] [--scales 1,4,16] [--max-history-tokens 4096]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "sessions"


def build_corpus(dest: Path, target_mb: float) -> list[Path]:
    src = sorted((DATA / "claude_code").glob("*.jsonl")) + sorted((DATA / "codex").glob("*.jsonl"))
    one = sum(f.stat().st_size for f in src)
    copies = max(1, round(target_mb * 1e6 / one))
    out = []
    for k in range(copies):
        proj = dest / f"-home-user-project{k:04d}"
        proj.mkdir(parents=True, exist_ok=True)
        for f in src:
            shutil.copyfile(f, proj / f.name)
            out.append(proj / f.name)
    return out


def parse_rate(files: list[Path], loads) -> float:
    t = time.perf_counter()
    n = 0
    for f in files:
        data = f.read_bytes()
        n += len(data)
        for line in data.split(b"\n"):
            if line:
                loads(line)
    return n / 1e6 / (time.perf_counter() - t)


def ingest_rate(corpus: Path, out: Path, redact: bool, mht: int | None) -> tuple[float, dict]:
    from composer_replication.ingestion import ingest_paths

    size = sum(f.stat().st_size for f in corpus.rglob("*.jsonl"))
    t = time.perf_counter()
    res = ingest_paths([corpus], out, redact=redact, max_history_tokens=mht, force=True)
    dt = time.perf_counter() - t
    return size / 1e6 / dt, res["totals"]


_CHILD = """
import resource, sys
from composer_replication.ingestion import ingest_paths
ingest_paths([sys.argv[1]], sys.argv[2], max_history_tokens=int(sys.argv[3]), force=True)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_mb(corpus: Path, out: Path, mht: int) -> float:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(corpus), str(out), str(mht)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(r.stdout.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit-mb", type=float, default=12.0, help="size of the 1x corpus")
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--max-history-tokens", type=int, default=4096)
    args = ap.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        big = tmp / f"x{max(scales)}"
        files = build_corpus(big, args.unit_mb * max(scales))
        mb = sum(f.stat().st_size for f in files) / 1e6
        print(f"corpus: {len(files)} files, {mb:.1f} MB")
        r_json = parse_rate(files, json.loads)
        r_orjson = parse_rate(files, orjson.loads)
        r_ing, totals = ingest_rate(big, tmp / "out", True, args.max_history_tokens)
        shutil.rmtree(tmp / "out")
        r_ing_nored, _ = ingest_rate(big, tmp / "out", False, args.max_history_tokens)
        shutil.rmtree(tmp / "out")
        print("| measure | MB/s | vs json.loads | vs orjson.loads |\n|---|---|---|---|")
        for name, r in [("json.loads (raw lines)", r_json), ("orjson.loads (raw lines)", r_orjson),
                        ("ingest_paths, redaction on", r_ing), ("ingest_paths, redaction off", r_ing_nored)]:  # fmt: skip
            print(f"| {name} | {r:.1f} | {r / r_json:.2f} | {r / r_orjson:.2f} |")
        print(
            f"\nstates {totals['n_states_emitted']}, examples {totals['n_examples']}, tool errors {totals['n_tool_errors']}"
        )
        print("\n| sessions | input MB | peak RSS MB |\n|---|---|---|")
        for s in scales:
            corpus = tmp / f"s{s}"
            fs = build_corpus(corpus, args.unit_mb * s)
            rss = peak_rss_mb(corpus, tmp / f"o{s}", args.max_history_tokens)
            print(f"| {s}x ({len(fs)} files) | {sum(f.stat().st_size for f in fs) / 1e6:.1f} | {rss:.0f} |")
            shutil.rmtree(corpus)
            shutil.rmtree(tmp / f"o{s}")


if __name__ == "__main__":
    main()
