"""DiLoCo outer loop over torchft (API reference §11).

The torchft names (``DiLoCo``, ``Manager``, ``_DummyWork``, ``_TORCHFT_AVAILABLE``) are resolved on
first access, so importing this package (or ``composer_replication``) does not import torchft. Without
torchft they are ``None``/``False`` and :func:`make_diloco_outer_loop` raises ``RuntimeError`` naming
the ``torchft`` extra.

DiLoCo (Douillard et al., arXiv 2311.08105): each replica runs ``sync_every`` inner optimizer steps,
then the replicas all-reduce the pseudo-gradient ``theta_global - theta_local`` and take one outer
step (SGD, lr 0.7, momentum 0.9, Nesterov). Streaming DiLoCo (arXiv 2501.18512) splits the model into
fragments synced in turn, with ``fragment_sync_delay`` inner steps of overlap and a mixing factor
``fragment_update_alpha`` between the local and the global parameters.

For replicas that cannot reach each other (Modal, HF Jobs, SageMaker jobs), see
:mod:`composer_replication.diloco.serverless`, which exchanges pseudo-gradients through an object store.
"""

from __future__ import annotations

from typing import Any

from composer_replication._extras import MissingExtraError

# torchft pulls in torch.distributed.tensor (~4 s of imports): resolve its names on first use (PEP 562),
# so object-store replicas, which never touch torchft, start faster.
_TORCHFT_NAMES = {
    "DiLoCo": ("torchft.local_sgd", "DiLoCo"),
    "Manager": ("torchft.manager", "Manager"),
    "_DummyWork": ("torchft.work", "_DummyWork"),
}


def _load_torchft() -> None:
    import importlib

    values: dict[str, Any] = {}
    try:
        for name, (module, attr) in _TORCHFT_NAMES.items():
            values[name] = getattr(importlib.import_module(module), attr)
        available = True
    except ImportError:
        values, available = dict.fromkeys(_TORCHFT_NAMES), False
    globals().update(values)
    globals().setdefault("_TORCHFT_AVAILABLE", available)


def __getattr__(name: str) -> Any:
    if name in _TORCHFT_NAMES or name == "_TORCHFT_AVAILABLE":
        _load_torchft()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DiLoCo", "Manager", "_DummyWork", "_TORCHFT_AVAILABLE", "make_diloco_outer_loop"]


def _validate_schedule(
    n_fragments: int, sync_every: int, fragment_sync_delay: int, fragment_update_alpha: float
) -> None:
    """Check the (Streaming) DiLoCo schedule up front, with errors that say what to change."""
    if n_fragments < 1:
        raise ValueError(
            "model_fragments is empty: pass [model] for DiLoCo or N modules for Streaming DiLoCo"
        )
    if sync_every < 1:
        raise ValueError(f"sync_every={sync_every} must be >= 1 (inner steps per outer round)")
    if sync_every < n_fragments or sync_every % n_fragments:
        raise ValueError(
            f"sync_every={sync_every} must be a positive multiple of the number of fragments ({n_fragments}): "
            f"fragments sync one at a time every sync_every/{n_fragments} steps; "
            f"try sync_every={max(n_fragments, sync_every // n_fragments * n_fragments)}"
        )
    per_fragment = sync_every // n_fragments
    if not 0 <= fragment_sync_delay < per_fragment:
        raise ValueError(
            f"fragment_sync_delay={fragment_sync_delay} must be in [0, sync_every/fragments = {per_fragment}): "
            "a fragment must finish syncing before its next sync starts"
        )
    if not 0.0 <= fragment_update_alpha <= 1.0:
        raise ValueError(
            f"fragment_update_alpha={fragment_update_alpha} must be in [0, 1] "
            "(0 = take the global parameters, 1 = keep the local ones)"
        )


def make_diloco_outer_loop(
    manager: Any,
    model_fragments: list[Any],
    inner_optimizer: Any,
    *,
    outer_lr: float = 0.7,
    outer_momentum: float = 0.9,
    nesterov: bool = True,
    sync_every: int = 100,
    fragment_sync_delay: int = 0,
    fragment_update_alpha: float = 0.0,
) -> Any:
    """Build a ``torchft.local_sgd.DiLoCo`` with the paper's outer optimizer (one SGD per fragment).

    Use the result as a context manager around the inner loop; syncing is driven by the inner
    optimizer's step hooks. The manager must use a synchronous quorum (``use_async_quorum=False``).
    The CPU backup of the global parameters is pinned only when CUDA is available.

    Raises:
        RuntimeError: torchft is not installed (``pip install 'composer-replication[torchft]'``).
        ValueError: a bad schedule (``sync_every`` not a multiple of the fragment count, a delay too
            long, alpha outside [0, 1], a negative learning rate or momentum).
    """
    if "_TORCHFT_AVAILABLE" not in globals():
        _load_torchft()
    if not globals()["_TORCHFT_AVAILABLE"]:  # the API reference promises RuntimeError here
        raise RuntimeError(str(MissingExtraError("torchft", "torchft", "make_diloco_outer_loop")))
    import torch

    fragments = list(model_fragments)
    _validate_schedule(len(fragments), sync_every, fragment_sync_delay, fragment_update_alpha)
    if outer_lr <= 0:
        raise ValueError(f"outer_lr={outer_lr} must be > 0 (the paper uses 0.7)")
    if not 0.0 <= outer_momentum < 1.0:
        raise ValueError(f"outer_momentum={outer_momentum} must be in [0, 1) (the paper uses 0.9)")
    if nesterov and outer_momentum == 0.0:
        raise ValueError("nesterov=True needs outer_momentum > 0; pass nesterov=False for plain SGD")
    # One outer optimizer per fragment, so each fragment's momentum advances only when it syncs.
    outer = [
        torch.optim.SGD(f.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=nesterov)
        for f in fragments
    ]
    return globals()["DiLoCo"](
        manager,
        fragments,
        inner_optimizer,
        outer if len(outer) > 1 else outer[0],
        sync_every=sync_every,
        pin_memory=torch.cuda.is_available(),
        fragment_sync_delay=fragment_sync_delay,
        fragment_update_alpha=fragment_update_alpha,
    )
