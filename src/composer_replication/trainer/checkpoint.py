"""Atomic training checkpoints and bit-identical resume.

A checkpoint is a directory ``step-XXXXXXXX`` holding ``state.pt``: the trainable parameters (all of them,
or only the LoRA adapter), optimizer, LR scheduler, the data order (epoch, permutation, position), the
RNG states (python, numpy, torch CPU and CUDA), the TAID scheduler, the step counter and the model's
dtype. It is written into a temporary sibling directory, fsynced and renamed into place, so a crash (even
SIGKILL) leaves either the previous or the new checkpoint, never a torn one; the oldest are pruned to
``keep_last``. A run on several processes (``trainer.distributed.engine``) adds ``rng-rank{r}.pt`` per rank and,
under FSDP2, keeps the parameters and optimizer state sharded in ``sharded/`` (``torch.distributed.checkpoint``)
instead of in ``state.pt``; :func:`load_trainable` reads either form into full tensors.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NAME = re.compile(r"^step-(\d{8})$")
SHARDED = "sharded"  # the torch.distributed.checkpoint directory of an FSDP2 checkpoint


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that training changes (all, or the adapter only under LoRA)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(root: str | Path) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _NAME.match(p.name)) and (p / "state.pt").is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: str | Path) -> Path | None:
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def begin_checkpoint(root: str | Path, step: int, *, tag: str | None = None) -> Path:
    """A fresh temporary directory for ``step`` under ``root`` (every rank of a run passes the same tag)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step-{step:08d}-{tag if tag is not None else os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def write_state(directory: str | Path, state: dict[str, Any], name: str = "state.pt") -> None:
    with open(Path(directory) / name, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def commit_checkpoint(root: str | Path, tmp: Path, step: int, *, keep_last: int = 2) -> Path:
    """Rename the finished ``tmp`` into ``root/step-XXXXXXXX`` and prune to ``keep_last``."""
    root = Path(root)
    final = root / f"step-{step:08d}"
    for sub in [p for p in tmp.rglob("*") if p.is_dir()] + [tmp]:
        _fsync_dir(sub)
    if final.exists():  # re-saving the same step (e.g. a kill-switch save right after a periodic one)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):  # leftovers of a run killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    return final


def save_checkpoint(root: str | Path, step: int, state: dict[str, Any], *, keep_last: int = 2) -> Path:
    """Write ``state`` atomically as ``root/step-XXXXXXXX`` and prune to ``keep_last``."""
    tmp = begin_checkpoint(root, step)
    write_state(tmp, state)
    return commit_checkpoint(root, tmp, step, keep_last=keep_last)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)


def checkpoint_dtype(path: str | Path) -> torch.dtype | None:
    """The dtype the model was trained in (``model_dtype`` in ``state.pt``; None for older checkpoints)."""
    name = load_checkpoint(path).get("model_dtype")
    return getattr(torch, name) if name else None


def load_trainable(path: str | Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained parameters of a checkpoint, in either form, on the CPU (one process, no process group).

    ``state.pt`` holds them under ``model`` (single process, DDP); an FSDP2 run keeps them sharded in
    ``sharded/`` (``torch.distributed.checkpoint``), read here into full tensors shaped like ``model``'s.
    """
    state = load_checkpoint(path)
    if "model" in state:
        return state["model"]
    import torch.distributed.checkpoint as dcp

    wanted = {n: torch.empty_like(p, device="cpu") for n, p in model.named_parameters() if p.requires_grad}
    dcp.load({"model": wanted}, checkpoint_id=str(Path(path) / SHARDED), no_dist=True)
    return wanted


def restore_model(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    missing = sorted(set(saved) - set(params))
    if missing:
        raise ValueError(
            f"checkpoint has parameters the model lacks (different model or LoRA setting?): {missing[:5]}"
        )
    with torch.no_grad():
        for name, value in saved.items():
            params[name].copy_(value)
