"""Golden loss curves: 10 optimizer steps of each training mode on the tiny model, committed under
``tests/assets/losses/`` and compared by ``tests/test_golden_curves.py``.

A refactor must reproduce these curves; a change that moves the numerics fails the suite. When a change
of the numerics is deliberate (a new loss normalisation, another rendering of traces, a TRL upgrade),
regenerate the curves on purpose and commit them with the change that explains why:

    python3 scripts/golden_curves.py            # rewrite tests/assets/losses/{offline,grpo}_tiny.json
    python3 scripts/golden_curves.py --check    # recompute and compare, as the test does

The input is a fixed slice of the bundled sessions (``tests/assets/losses/data/``: materialised traces and
preference pairs), so changes to ingestion do not move the curves; ``--data`` rebuilds that slice from
``tests/data/sessions`` (do it only when the trace format itself changes). Every run uses one CPU
thread, deterministic algorithms and ``seed: 0``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "tests" / "assets" / "losses"
DATA = ASSETS / "data"
STEPS = 10
# Relative tolerance of the comparison: far below any change of the loss itself (a reordered float32
# sum moves the 6th digit), far above nothing.
RTOL = 1e-4
ATOL = 1e-7

KEYS = {
    "offline": ("loss/total", "loss/lm_ce", "loss/sdpo_jsd", "loss/trace_replay_dpo", "grad_norm"),
    "grpo": ("loss/total", "reward", "reward_std", "entropy", "grad_norm"),
}


def config(mode: str) -> dict[str, Any]:
    """The run each curve records (data paths filled in by `curve`)."""
    cfg: dict[str, Any] = {
        "mode": mode,
        "seed": 0,
        "model": {"path": "tiny"},
        "data": {"max_seq_len": 256, "max_dpo_seq_len": 128},
        "loss": {"sdpo": {"weight": 1.0}, "preference": {"weight": 1.0}},
        "optimizer": {"lr": 3e-3},
        "schedule": {"max_steps": STEPS, "batch_size": 2},
        "checkpoint": {"every_steps": 0, "keep_last": 1},
        "logging": {"progress": False, "plot": False},
    }
    if mode == "grpo":
        cfg["data"] = {"max_seq_len": 128, "max_dpo_seq_len": 128}
        cfg["loss"] = {"sdpo": {"weight": 0.5}, "preference": {"weight": 0.5}}
        cfg["optimizer"] = {"lr": 1e-3}
        cfg["schedule"] = {"max_steps": STEPS, "batch_size": 4}
        cfg["grpo"] = {"objective": "dr_grpo", "num_generations": 4, "max_completion_length": 8}
    return cfg


@contextlib.contextmanager
def _one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def curve(mode: str) -> dict[str, list[float]]:
    """Train ``mode`` for `STEPS` steps on the fixed data; ``{key: [value per step]}``."""
    from composer_replication.config import build_config

    cfg = config(mode)
    cfg["data"].update(traces=str(DATA / "traces.jsonl"), pairs=str(DATA / "pairs.jsonl"))
    with tempfile.TemporaryDirectory() as out, _one_thread():
        if mode == "offline":
            from composer_replication.trainer.offline.loop import train_offline

            train_offline(build_config(cfg), out_dir=out)
        else:
            from composer_replication.trainer.grpo.run import train_grpo

            train_grpo(build_config(cfg), out_dir=out)
        rows = [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines() if x.strip()]
    if [r["step"] for r in rows] != list(range(1, STEPS + 1)):
        raise RuntimeError(
            f"{mode}: expected one metrics row per step 1..{STEPS}, got {[r['step'] for r in rows]}"
        )
    return {k: [float(r[k]) for r in rows] for k in KEYS[mode]}


def differences(mode: str, got: dict[str, list[float]], want: dict[str, list[float]]) -> list[str]:
    """Where ``got`` leaves the golden curve (empty: it reproduces it)."""
    out = []
    for key in KEYS[mode]:
        for step, (g, w) in enumerate(zip(got[key], want[key], strict=True), start=1):
            if not math.isclose(g, w, rel_tol=RTOL, abs_tol=ATOL):
                out.append(f"{mode} {key} step {step}: {g!r} != golden {w!r}")
    return out


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "transformers", "trl")}


def build_data() -> None:
    """Slice the bundled sessions into the fixed inputs (traces with a hinted error site, a few pairs)."""
    import torch

    from composer_replication.ingestion import ingest_paths
    from composer_replication.models import build_tiny_tokenizer
    from composer_replication.trainer.data import (
        load_rows,
        make_collator,
        recovery_pairs,
        trace_batch,
    )

    with tempfile.TemporaryDirectory() as tmp:
        ingest_paths([ROOT / "tests" / "data" / "sessions"], Path(tmp))
        traces = load_rows(Path(tmp) / "traces.jsonl")
    collator = make_collator(build_tiny_tokenizer(2048), 256, 128, True)
    sites = [t for t in traces if trace_batch(collator, [t]).get("sdpo_loss_mask", torch.zeros(1)).sum() > 0]
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in sites[:6]))
    (DATA / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in recovery_pairs(traces)[:8]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modes", nargs="*", metavar="MODE", help=f"any of {', '.join(KEYS)} (default: all)")
    p.add_argument("--check", action="store_true", help="compare with the committed curves; write nothing")
    p.add_argument("--data", action="store_true", help="first rebuild tests/assets/losses/data/")
    args = p.parse_args(argv)
    for mode in args.modes:  # choices= rejects nargs="*"'s default list in Python 3.11, hence by hand
        if mode not in KEYS:
            p.error(f"unknown mode {mode!r}; choose from {', '.join(KEYS)}")
    args.modes = args.modes or list(KEYS)
    if args.data:
        build_data()
    bad: list[str] = []
    for mode in args.modes:
        got = curve(mode)
        path = ASSETS / f"{mode}_tiny.json"
        if args.check:
            bad += differences(mode, got, json.loads(path.read_text())["curves"])
            continue
        record = {"steps": STEPS, "config": config(mode), "versions": _versions(), "curves": got}
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
