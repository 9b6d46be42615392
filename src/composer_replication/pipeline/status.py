"""Where a run stands: per-stage status, counts, spend so far, last checkpoint, the report path."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from composer_replication.pipeline.manifest import MANIFEST_NAME, Manifest

_CKPT = re.compile(r"^(?:checkpoint|step)[-_]?(\d+)$")


def spent_usd(ledger_path: Path) -> float:
    """USD booked in a replay ledger so far (settled calls plus any reservation left open by a crash)."""
    from composer_replication.teacher_replay.ledger import ledger_total

    return ledger_total(ledger_path)


def last_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``checkpoint-N`` directory under ``train/`` (GRPO phase after the offline one)."""
    best: tuple[int, int, Path] | None = None
    for phase_rank, phase in enumerate(("offline", "grpo")):
        root = run_dir / "train" / phase
        if not root.exists():
            continue
        for d in root.rglob("*"):
            m = _CKPT.match(d.name)
            if d.is_dir() and m:
                key = (phase_rank, int(m.group(1)), d)
                if best is None or key[:2] > best[:2]:
                    best = key
    return best[2] if best else None


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """A plain-data summary of ``run_dir`` (what ``composer-replication status`` prints)."""
    run_dir = Path(run_dir)
    start = f"start a run there with `composer-replication run CONFIG --out {run_dir}`"
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such directory ({start})")
    if not run_dir.is_dir():
        raise NotADirectoryError(
            f"{run_dir}: is a file, not a run directory (pass the directory `run` wrote)"
        )
    if not (run_dir / MANIFEST_NAME).exists():
        raise FileNotFoundError(f"{run_dir}: not a run directory: it has no {MANIFEST_NAME} ({start})")
    m = Manifest.load(run_dir)
    stages = {
        name: {
            "status": r.status,
            "attempts": r.attempts,
            "summary": r.summary,
            "error": r.error,
            "finished_at": r.finished_at,
        }
        for name, r in m.stages.items()
    }
    from composer_replication._lock import lock_holder

    report = run_dir / "report" / "report.html"
    ckpt = last_checkpoint(run_dir)
    cfg = m.data.get("config", {})
    spend = spent_usd(run_dir / "replay" / "ledger.jsonl")
    cap = cfg.get("replay", {}).get("max_total_usd")
    return {
        "run_dir": str(run_dir),
        "updated_at": m.data.get("updated_at"),
        "in_use_by": lock_holder(run_dir),
        "stages": stages,
        "spend_usd": spend,
        "max_total_usd": cap,
        "overrun": cap is not None and spend > cap + 1e-12,
        "last_checkpoint": str(ckpt) if ckpt else None,
        "report": str(report) if report.exists() else None,
    }


def format_status(st: dict[str, Any]) -> str:
    lines = [f"run {st['run_dir']}"]
    if st.get("updated_at"):
        lines[0] += f"  (updated {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(st['updated_at']))})"
    width = max((len(n) for n in st["stages"]), default=5)
    for name, s in st["stages"].items():
        summ = " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in s["summary"].items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool)
        )
        tail = f"  error: {s['error']}" if s.get("error") else ""
        lines.append(f"  {name:<{width}}  {s['status']:<8}  {summ}{tail}")
    if st.get("in_use_by"):
        lines.insert(1, f"  in use by {st['in_use_by']}")
    cap = st.get("max_total_usd")
    lines.append(f"spend: ${st['spend_usd']:.4f}" + (f" of ${cap:.2f} cap" if cap is not None else ""))
    if st.get("overrun"):
        lines[-1] += (
            f"  ** OVERRUN by ${st['spend_usd'] - cap:.4f}: a provider billed above the planned prices "
            "(see replay/ledger.jsonl, entries marked overrun) **"
        )
    lines.append(f"last checkpoint: {st['last_checkpoint'] or '-'}")
    lines.append(f"report: {st['report'] or '- (not written yet)'}")
    return "\n".join(lines)
