"""Secret redaction: false positives on ML library code, and throughput against a baseline version.

One invocation measures, for the current ``Redactor`` and (with ``--baseline REV``) the ``redact.py`` of an
older commit side by side:

* false positives: every ``.py`` file of the installed packages (default ``transformers`` and ``trl``) is
  redacted whole, as a ``Read`` of it would be; each redaction is listed (file, line, type, the line) and
  counted per 100k lines. Library code holds no live secrets, so every hit is a false positive unless the
  listing shows otherwise (a real e-mail address, a test token committed on purpose);
* throughput (MB/s of UTF-8 text): the strings the ingesters pass to the redactor on the bundled sessions
  (``tests/data/sessions``), and the library sources above; best of ``--repeats`` interleaved runs;
* ``ingest_paths`` MB/s on the bundled sessions with redaction on (current, baseline) and off.

The false positives are also given per package (``--packages transformers,trl,torch,datasets,accelerate,peft``;
``--fp-only`` skips the throughput runs).

Usage: python3 benchmarks/bench_redaction.py [--packages transformers,trl] [--baseline a9ffa06] [--repeats 5]
       [--fp-only] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "sessions"
REDACT_PY = "src/composer_replication/ingestion/redact.py"


def load_baseline(rev: str) -> type:
    """The ``Redactor`` class of ``redact.py`` at git revision ``rev`` (a self-contained module then)."""
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{REDACT_PY}"], capture_output=True, text=True, check=True
    ).stdout
    mod = types.ModuleType(f"redact_{rev}")
    exec(compile(src, f"{rev}:{REDACT_PY}", "exec"), mod.__dict__)
    return mod.Redactor


def library_files(packages: list[str]) -> list[tuple[str, str]]:
    out = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"package {name!r} is not installed (pip install {name})")
        root = Path(next(iter(spec.submodule_search_locations)))
        for f in sorted(root.rglob("*.py")):
            out.append((f"{name}/{f.relative_to(root)}", f.read_text(errors="replace")))
    return out


def false_positives(
    redactor_cls: type, files: list[tuple[str, str]], per_pkg: Counter | None = None
) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    hits = []
    for rel, src in files:
        r = redactor_cls()
        r.redact(src)
        if not r.counts:
            continue
        counts.update(r.counts)
        if per_pkg is not None:
            per_pkg[rel.split("/")[0]] += sum(r.counts.values())
        for i, line in enumerate(src.splitlines(), 1):
            lr = redactor_cls()
            if lr.redact(line) != line:
                hits.append(f"{rel}:{i}: {','.join(sorted(lr.counts))}: {line.strip()[:140]}")
    return counts, hits


def per_package(files: list[tuple[str, str]], per_pkg: Counter) -> dict[str, dict[str, float]]:
    """Files, lines and redactions per package, and the redactions per 100k lines."""
    out: dict[str, dict[str, float]] = {}
    for rel, src in files:
        p = out.setdefault(rel.split("/")[0], {"files": 0, "lines": 0})
        p["files"] += 1
        p["lines"] += src.count("\n")
    for name, p in out.items():
        p["redactions"] = per_pkg[name]
        p["per_100k_lines"] = round(per_pkg[name] / max(1, p["lines"]) * 1e5, 2)
    return out


def session_strings() -> list[str]:
    """Every string the two ingesters hand to the redactor on the bundled sessions."""
    from composer_replication.ingestion import detect_format
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.ingestion.codex import CodexIngester
    from composer_replication.ingestion.redact import Redactor

    seen: list[str] = []

    class Recorder(Redactor):
        def redact(self, text: str) -> str:
            seen.append(text)
            return text

    rec = Recorder()
    ingesters = {"claude_code": ClaudeCodeIngester(redactor=rec), "codex": CodexIngester(redactor=rec)}
    for f in sorted(DATA.rglob("*.jsonl")):
        ingesters[detect_format(f)].ingest_file(f)
    return seen


def redact_seconds(redactor_cls: type, texts: list[str]) -> float:
    r = redactor_cls()
    t = time.perf_counter()
    for s in texts:
        r.redact(s)
    return time.perf_counter() - t


def ingest_seconds(redact: bool, redactor_cls: type | None) -> float:
    import composer_replication.ingestion as ing
    import composer_replication.ingestion.redact as red

    original = red.Redactor
    try:
        if redactor_cls is not None:
            red.Redactor = redactor_cls  # ingest_paths builds its Redactor from this name
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            ing.ingest_paths([DATA], d, redact=redact, force=True)
            return time.perf_counter() - t
    finally:
        red.Redactor = original


def throughput(
    impls: dict[str, type], corpora: dict[str, list[str]], repeats: int
) -> dict[str, dict[str, float]]:
    """MB/s per implementation and corpus (plus ``ingest``), best of ``repeats`` runs interleaved so that
    every implementation sees the same machine load."""
    sizes = {c: sum(len(t.encode()) for t in texts) for c, texts in corpora.items()}
    sizes["ingest"] = sum(f.stat().st_size for f in DATA.rglob("*.jsonl"))
    best: dict[tuple[str, str], float] = {}
    runs = [(label, c) for label in impls for c in [*corpora, "ingest"]] + [("redaction off", "ingest")]
    for _ in range(repeats):
        for label, c in runs:
            if c == "ingest":
                sec = ingest_seconds(label != "redaction off", impls.get(label))
            else:
                sec = redact_seconds(impls[label], corpora[c])
            best[label, c] = min(best.get((label, c), float("inf")), sec)
    out: dict[str, dict[str, float]] = {}
    for (label, c), sec in best.items():
        out.setdefault(label, {})[c] = round(sizes[c] / 1e6 / sec, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", default="transformers,trl")
    ap.add_argument("--baseline", default=None, help="git revision whose redact.py is the baseline")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--fp-only", action="store_true", help="false positives only (no throughput runs)")
    args = ap.parse_args()
    import warnings

    from composer_replication.ingestion.redact import Redactor

    warnings.simplefilter("ignore")  # ingest_paths warns when redaction is off
    impls = {"current": Redactor}
    if args.baseline:
        impls[f"baseline {args.baseline}"] = load_baseline(args.baseline)
    files = library_files(args.packages.split(","))
    n_lines = sum(src.count("\n") for _, src in files)
    lib_texts = [src for _, src in files]
    sess_texts = session_strings()
    result: dict = {"library_lines": n_lines, "library_files": len(files), "impls": {}}
    print(f"library: {len(files)} files, {n_lines:,} lines ({args.packages})")
    print(f"sessions: {len(sess_texts):,} strings, {sum(len(t.encode()) for t in sess_texts) / 1e6:.2f} MB")
    for label, cls in impls.items():
        per_pkg: Counter = Counter()
        counts, hits = false_positives(cls, files, per_pkg)
        total = sum(counts.values())
        row = {"redactions": dict(counts), "per_100k_lines": round(total / n_lines * 1e5, 2), "hits": hits}
        row["per_package"] = per_package(files, per_pkg)
        result["impls"][label] = row
        print(f"\n[{label}] {total} redactions = {row['per_100k_lines']} per 100k lines: {dict(counts)}")
        for pkg, p in row["per_package"].items():
            print(f"    {pkg}: {p['files']} files, {p['lines']:,} lines, {p['redactions']} redactions, "
                  f"{p['per_100k_lines']} per 100k lines")  # fmt: skip
        for h in hits[:40]:
            print("   ", h)
        if len(hits) > 40:
            print(f"    ... {len(hits) - 40} more")
    if args.fp_only:
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        return
    speed = throughput(impls, {"sessions": sess_texts, "library": lib_texts}, args.repeats)
    result["MBps"] = speed
    print(
        f"\nMB/s, best of {args.repeats} interleaved runs (redact: the text redacted; ingest: session file bytes)"
    )
    print(f"{'':<22}{'redact sessions':>16}{'redact library':>16}{'ingest_paths':>14}")
    for label, row in speed.items():
        print(
            f"{label:<22}{row.get('sessions', float('nan')):>16}{row.get('library', float('nan')):>16}{row['ingest']:>14}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
