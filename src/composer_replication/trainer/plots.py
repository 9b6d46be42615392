"""A PNG of the per-channel losses from ``metrics.jsonl`` (matplotlib, Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication._extras import require

CHANNELS = ("loss/total", "loss/lm_ce", "loss/sdpo_jsd", "loss/trace_replay_dpo")


def pyplot(purpose: str = "plots") -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display); the error names the ``plot`` extra."""
    require("plot", "matplotlib", purpose=purpose)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_losses(
    metrics_path: str | Path, png_path: str | Path, keys: tuple[str, ...] = CHANNELS
) -> Path | None:
    """Plot each channel against the step, one panel per channel; returns the PNG path (None if no rows)."""
    plt = pyplot()
    from composer_replication._io import atomic_open, read_jsonl

    rows = list(read_jsonl(metrics_path))
    present = [k for k in keys if any(k in r for r in rows)]
    if not rows or not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(4 * len(present), 3.2), squeeze=False)
    for ax, key in zip(axes[0], present):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 50 else None)
        ax.set_title(key.removeprefix("loss/"))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png_path = Path(png_path)
    with atomic_open(png_path, "wb", encoding=None) as fh:
        fig.savefig(fh, format="png", dpi=100)
    plt.close(fig)
    return png_path
