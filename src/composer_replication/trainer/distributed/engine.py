"""Data-parallel offline training: ``torchrun``, ``accelerate launch`` or ``train --nproc N``; DDP or FSDP2.

The offline trainer talks to one :class:`Engine`. The single-process engine does nothing; the
:class:`DistributedEngine` (one per rank, ``torch.distributed`` initialised from the launcher's
environment by :func:`setup`) makes N processes train as one:

- **Data.** Every rank walks the same stream order (a pure function of seed and epoch); of each group
  of N consecutive micro-batches, rank r trains on the r-th (:class:`RankStream`). The streams' state is
  therefore the same on every rank, and a run with N processes and ``grad_accum = g`` sees exactly
  the micro-batches, grouped into the same optimizer steps, of one process with ``grad_accum = N·g``.
  Gradients are averaged over ranks, as accumulation averages over micro-batches, so the two runs
  have the same loss trajectory up to float summation order (tested to 1e-5 relative).
- **DDP** (``distributed.strategy: ddp``): ``DistributedDataParallel`` over a module that runs the
  whole three-channel loss (:class:`_LossRunner`), so the loss may call the model several times (student,
  hinted teacher, chosen, rejected) and reach its hidden states for the fused kernels; gradients are
  all-reduced during the last micro-batch's backward (``no_sync`` before it).
- **FSDP2** (``distributed.strategy: fsdp2``): ``fully_shard`` on every decoder layer and on the root;
  the model is loaded on the CPU and each layer's shard moved to its device, so the model need not fit
  one device. The root's parameters (embeddings, final norm, head) are unsharded before each loss so the
  fused kernels can use the head directly.
- **Metrics** are averaged over ranks before logging; only rank 0 writes files. A stop (STOP file,
  SIGTERM, kill switch) on any rank stops every rank at the same step.
- **Checkpoints**: DDP writes the single-process ``state.pt`` (rank 0; the replicas are identical), so a
  run resumes at any world size; FSDP2 writes the trainable parameters and the optimizer state with
  ``torch.distributed.checkpoint`` into ``sharded/`` and the rest to ``state.pt``. Each rank's RNG state
  is kept (``rng-rank{r}.pt``). All ranks write into one temporary directory that rank 0 renames into
  place after a barrier, so a rank killed mid-save leaves the previous checkpoint.

Launching (the environment, the rendezvous, ``--nproc``) is in :mod:`trainer.distributed.launch`; its errors
are one-line ``LaunchError`` s raised before any model loads.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from composer_replication.trainer import checkpoint as ckpt
from composer_replication.trainer.distributed.launch import LaunchError, init_process_group, launch_env

__all__ = ["DistributedEngine", "Engine", "NullLog", "RankStream", "setup"]


class RankStream:
    """A stream as seen by one rank: of each ``world_size`` consecutive batches, the ``rank``-th.

    The wrapped stream (``trainer.data.Stream``) advances identically on every rank, so its state is
    rank-independent.
    """

    def __init__(self, stream: Any, rank: int, world_size: int) -> None:
        self.stream, self.rank, self.world_size = stream, rank, world_size

    def next_batch(self) -> list[Any]:
        batches = [self.stream.next_batch() for _ in range(self.world_size)]
        return batches[self.rank]

    def state_dict(self) -> dict[str, int]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.stream.load_state_dict(state)


class NullLog:
    """Stands in for the metrics log on ranks other than 0."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class Engine:
    """One process: no collectives; checkpoints are ``checkpoint.save_checkpoint``'s ``state.pt``."""

    rank, world_size, local_rank, strategy = 0, 1, 0, "none"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def load_args(self, cfg: Any) -> tuple[Any, torch.device]:
        """``(config, device)`` for ``load_model`` before :meth:`prepare`."""
        return cfg, self.device

    def prepare(self, model: Any) -> Any:
        return model

    def unsharded(self, model: Any) -> Any:
        """``model``, ready for direct calls (evaluation, reference log-probs)."""
        return model

    def stream(self, stream: Any) -> Any:
        return stream

    def loss(self, model: Any, batch: dict[str, torch.Tensor], loss: Any, *, sync: bool = True, **call: Any):
        """``loss(model, batch, **call)``: a :class:`~composer_replication.loss.ComposedLoss` on one
        micro-batch (``call``: its ``taid_t``, ``sdpo_inputs``)."""
        return loss(model, batch, **call)

    def reference_logprobs(self, model: Any, tok: Any, pairs: list[dict], max_len: int) -> dict[str, tuple]:
        from composer_replication.trainer.pair_tokens import reference_logprobs

        return reference_logprobs(model, tok, pairs, max_len)

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        return values

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float | None) -> float:
        """Clip to ``max_norm`` (None: only measure) and return the norm over all processes' gradients."""
        total = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if max_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def agree(self, reason: str | None) -> str | None:
        return reason

    def barrier(self) -> None:
        pass

    def save(
        self, root: Path, step: int, state: dict[str, Any], *, model: Any, optimizer: Any, keep_last: int
    ) -> Path:
        return ckpt.save_checkpoint(root, step, state, keep_last=keep_last)

    def load(self, path: Path, stepper: Any) -> dict[str, Any]:
        """Restore ``stepper`` and this process's RNG from the checkpoint at ``path``; return its state."""
        state = ckpt.load_checkpoint(path)
        stepper.load_state_dict(state)
        ckpt.set_rng_state(state["rng"])
        return state


class _LossRunner(torch.nn.Module):
    """The module DDP wraps: one forward = the whole three-channel loss of a micro-batch."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor], loss: Any, call: dict[str, Any]):
        return loss(self.model, batch, **call)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one (Hugging Face lists their class in ``_no_split_modules``)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise LaunchError(
            f"FSDP2: found no decoder layers in {type(model).__name__} (no _no_split_modules); "
            "use distributed.strategy: ddp"
        )
    return layers


class DistributedEngine(Engine):
    """One rank of a DDP or FSDP2 run (see the module docstring)."""

    def __init__(self, env: dict[str, Any], strategy: str, device: torch.device) -> None:
        super().__init__(device)
        self.rank, self.world_size = env["rank"], env["world_size"]
        self.local_rank = env["local_rank"]
        self.strategy = strategy
        self._ddp: Any = None
        self._model: Any = None

    def load_args(self, cfg: Any) -> tuple[Any, torch.device]:
        if self.strategy != "fsdp2":
            return cfg, self.device
        # FSDP2: loaded on the CPU in the dtype it trains in; prepare() moves each shard to the device
        dtype = cfg.model.dtype
        if dtype == "auto":
            cuda = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
            dtype = "bfloat16" if cuda else "float32"
        return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype})}), torch.device(
            "cpu"
        )

    def prepare(self, model: Any) -> Any:
        self._model = model
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # buffers (rotary tables) are constants: no per-forward broadcast
            self._ddp = DistributedDataParallel(_LossRunner(model), device_ids=ids, broadcast_buffers=False)
            return model
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # One forward through the root first, so that it becomes FSDP's root (lazy init) before anything
        # calls a module below it directly (the fused kernels, PEFT's unwrapped model); then reshard, so
        # that model.parameters() are the sharded ones the optimizer must hold.
        with torch.no_grad():
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device))
        model.reshard()
        return model

    def unsharded(self, model: Any) -> Any:
        """FSDP2: the root's parameters (embeddings, final norm, head) all-gathered, so that the fused
        kernels can run the base model and the head directly; the root's next backward (or
        :meth:`_sharded`) reshards them. While unsharded, ``model.parameters()`` are the gathered copies."""
        if self.strategy == "fsdp2":
            model.unshard()
        return model

    def _sharded(self, model: Any) -> Any:
        if self.strategy == "fsdp2":
            model.reshard()
        return model

    def stream(self, stream: Any) -> Any:
        return RankStream(stream, self.rank, self.world_size)

    def loss(self, model: Any, batch: dict[str, torch.Tensor], loss: Any, *, sync: bool = True, **call: Any):
        if self._ddp is not None:
            with nullcontext() if sync else self._ddp.no_sync():
                return self._ddp(batch, loss, call)
        self.unsharded(model)  # the fused kernels read the head and run the base model directly
        return loss(model, batch, **call)

    def reference_logprobs(self, model: Any, tok: Any, pairs: list[dict], max_len: int) -> dict[str, tuple]:
        """Batches of 4 pairs dealt round-robin to the ranks (the single-process batches, so the same
        values); every rank runs as many batches (FSDP2 forwards are collective), then all gather."""
        from composer_replication.trainer.pair_tokens import reference_logprobs

        chunks = [pairs[i : i + 4] for i in range(0, len(pairs), 4)]
        mine = chunks[self.rank :: self.world_size]
        rounds = -(-len(chunks) // self.world_size)
        out: dict[str, tuple] = {}
        self.unsharded(model)
        for k in range(rounds):
            got = reference_logprobs(model, tok, mine[k] if k < len(mine) else chunks[0], max_len)
            if k < len(mine):
                out.update(got)
        self._sharded(model)
        merged: dict[str, tuple] = {}
        for part in self._gather(out):
            merged.update(part)
        return merged

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float | None) -> float:
        if self.strategy != "fsdp2":
            return super().clip_grad_norm(params, max_norm)
        import torch.distributed as dist

        # Sharded gradients: sum the squares of the local shards in float64 and all-reduce. (The DTensor
        # norm of torch 2.13 was off by 1e-5 relative on a sharded embedding gradient here.)
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        from torch.distributed.tensor import DTensor

        for p in params:
            if p.grad is not None:
                grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad  # FSDP2: DTensor shards
                sq += torch.linalg.vector_norm(grad, dtype=torch.float64) ** 2
        dist.all_reduce(sq)
        total = sq.sqrt().float()
        if max_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def _gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts

    def mean(self, values: dict[str, float]) -> dict[str, float]:
        parts = self._gather(values)
        keys = sorted({k for p in parts for k in p})
        return {k: sum(p.get(k, 0.0) for p in parts) / self.world_size for k in keys}

    def agree(self, reason: str | None) -> str | None:
        return next((r for r in self._gather(reason) if r is not None), None)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def _sharded_state(self, model: Any, optimizer: Any) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        self._sharded(model)  # the optimizer holds the sharded parameters
        trainable = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
        return {"model": trainable, "optim": get_optimizer_state_dict(model, optimizer)}

    def save(
        self, root: Path, step: int, state: dict[str, Any], *, model: Any, optimizer: Any, keep_last: int
    ) -> Path:
        import torch.distributed.checkpoint as dcp

        tmp = Path(root) / f".tmp-step-{step:08d}-dist"
        if self.is_main:
            ckpt.begin_checkpoint(root, step, tag="dist")
        self.barrier()
        if self.strategy == "fsdp2":
            dcp.save(self._sharded_state(model, optimizer), checkpoint_id=str(tmp / ckpt.SHARDED))
            state = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
        if self.is_main:
            ckpt.write_state(tmp, state)
        else:
            ckpt.write_state(tmp, {"rng": state["rng"]}, name=f"rng-rank{self.rank}.pt")
        self.barrier()
        final = Path(root) / f"step-{step:08d}"
        if self.is_main:
            final = ckpt.commit_checkpoint(root, tmp, step, keep_last=keep_last)
        self.barrier()
        return final

    def load(self, path: Path, stepper: Any) -> dict[str, Any]:
        state = ckpt.load_checkpoint(path)
        if "model" not in state:  # FSDP2: parameters and optimizer state come from sharded/
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

            sharded = self._sharded_state(stepper.model, stepper.opt)
            dcp.load(sharded, checkpoint_id=str(Path(path) / ckpt.SHARDED))
            set_optimizer_state_dict(stepper.model, stepper.opt, optim_state_dict=sharded["optim"])
            state = {**state, "model": {}, "optimizer": stepper.opt.state_dict()}
        stepper.load_state_dict(state)
        own = Path(path) / f"rng-rank{self.rank}.pt"
        rng = torch.load(own, weights_only=False)["rng"] if own.is_file() else state["rng"]
        ckpt.set_rng_state(rng)
        return state


def setup(cfg: Any, device: str | None = None) -> Engine:
    """The engine for this process: single-process, or one rank of a launched run (process group
    initialised here, if the launcher has not). Raises :class:`LaunchError` before any model loads."""
    env = launch_env()
    if env is None:
        return Engine(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    import torch.distributed as dist

    d = cfg.distributed
    sdpo = getattr(getattr(cfg, "loss", None), "sdpo", None)
    if d.strategy == "fsdp2" and sdpo is not None and sdpo.source == "on_policy" and sdpo.weight > 0:
        raise LaunchError(
            "loss.sdpo.source on_policy samples a different number of tokens on each rank, and FSDP2's "
            "forwards are collective: use distributed.strategy ddp (or source: recorded)"
        )
    cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if cuda:
        count = torch.cuda.device_count()
        if env["local_world_size"] > count:
            raise LaunchError(
                f"{env['local_world_size']} processes on this node but {count} CUDA device(s): "
                f"start at most {count} per node"
            )
        torch.cuda.set_device(env["local_rank"])
        dev = torch.device("cuda", env["local_rank"])
    else:
        dev = torch.device("cpu")
    if not dist.is_initialized():
        init_process_group(env, d, "nccl" if cuda else "gloo", dev if cuda else None)
    return DistributedEngine(env, d.strategy, dev)
