#!/usr/bin/env bash
# Ingestion compiled with mypyc vs pure Python, side by side (docs/benchmarks/ingestion.md, "Throughput, fourth
# pass"). An experiment, not a build: the compiled copy lives in a temporary folder (never beside anyone's
# sources) and is deleted at the end. Needs mypy (dev extra; it ships mypyc) and a C compiler.
#
# Usage: bash benchmarks/bench_ingest_mypyc.sh [all] [--callgrind]
#   all          compile every ingestion module mypyc accepts, not only the parsing/assembly hot path
#   --callgrind  count instructions (valgrind) for one ingest of tests/data/sessions instead of timing
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
I=composer_replication/ingestion
MODS="$I/claude_code.py $I/_claude_assemble.py $I/codex.py $I/_base.py $I/redact.py $I/errors.py $I/_build.py"
MODS="$MODS $I/_session.py $I/_reader.py composer_replication/wire.py"
[ "${1:-}" = all ] && { MODS="$MODS $I/_folder.py $I/_index.py $I/_json.py $I/_select.py $I/_redact_rules.py"; shift; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp -r "$ROOT/src" "$ROOT/pyproject.toml" "$TMP/"
find "$TMP/src" -name __pycache__ -prune -exec rm -rf {} +
start=$(date +%s)
(cd "$TMP/src" && mypyc $MODS >"$TMP/build.log" 2>&1) || { tail -20 "$TMP/build.log"; exit 1; }
echo "mypyc build: $(($(date +%s) - start)) s ($(echo $MODS | wc -w) modules)"
PY=$(python3 -c 'import sys; print(sys.executable)')  # the real interpreter, not a pyenv shim (valgrind)
cd "$ROOT"
if [ "${1:-}" = --callgrind ]; then
  cat >"$TMP/cg.py" <<'EOF'
import sys, tempfile, orjson
from pathlib import Path
from composer_replication.ingestion import ingest_paths
data = Path("tests/data/sessions")
with tempfile.TemporaryDirectory() as t:
    ingest_paths([data], Path(t) / "warm", force=True)  # imports and first-call costs out of the count
    if sys.argv[1] == "orjson":
        for f in sorted(data.rglob("*.jsonl")):
            for line in f.read_bytes().split(b"\n"):
                if line:
                    orjson.loads(line)
    elif sys.argv[1] == "ingest":
        ingest_paths([data], Path(t) / "out", force=True)
EOF
  for src in "$ROOT/src" "$TMP/src"; do
    declare -A n
    for m in none orjson ingest; do
      n[$m]=$(PYTHONPATH=$src valgrind --tool=callgrind --callgrind-out-file=/dev/null "$PY" "$TMP/cg.py" $m 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    done
    python3 -c "import sys; z, o, i = map(int, sys.argv[2:]); print(f'{sys.argv[1]}: orjson loop {o - z:.4g}, ingest {i - z:.4g} instructions, ingest vs orjson loop {(o - z) / (i - z):.3f}x')" \
      "$src" "${n[none]}" "${n[orjson]}" "${n[ingest]}"
  done
else
  for src in "$ROOT/src" "$TMP/src" "$ROOT/src" "$TMP/src"; do
    echo "=== PYTHONPATH=$src ($(PYTHONPATH=$src "$PY" -c 'import composer_replication.ingestion.claude_code as c; print(c.__file__.rsplit(".", 1)[-1])'))"
    PYTHONPATH=$src "$PY" -u benchmarks/bench_ingest.py --only throughput --unit-mb 12 --scales 16 --repeat 3 2>/dev/null
  done
fi
