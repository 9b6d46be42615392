"""Offline-step rows of ``gpu_bench.py``: one optimizer step of the trainer's loss on a model built from a
config with random weights (nothing downloads), three channels vs plain SFT, and the same step under
2-process DDP through the trainer's own ``DistributedEngine``.

The batch is synthetic: ``B`` student rows of ``T`` tokens (the last 3/4 are the response), a hinted
teacher row per student row (a ``hint``-token hint before the same response), and ``B`` chosen/rejected
pairs of ``T`` tokens with cached reference log-probs: the shapes of the real trainer's micro-batch.
``compose_loss`` picks its logits path as in training (``auto``: fused-linear from a vocabulary of 32768).
A step is forward + backward + AdamW; time is the median of ``repeats`` steps after one warm-up.

Rows (dicts, printed one JSON line each by ``gpu_bench.py``): ``offline-sft``, ``offline-3ch``,
``offline-3ch-vs-sft`` (ratios) and ``ddp-3ch`` (2 processes; ``scaling_efficiency`` = aggregate
tokens/s over twice the one-process rate).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Hugging Face Qwen2.5 configs (public config.json values); tiny = models.build_tiny_model
PRESETS: dict[str, dict[str, Any]] = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
}  # fmt: skip


def build_model(preset: str, device: Any, dtype: Any) -> Any:
    import torch

    if preset == "tiny":
        from composer_replication.models import build_tiny_model

        return build_tiny_model(seed=0).to(device=device, dtype=dtype)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**PRESETS[preset], max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    with torch.device(device):  # initialised on the device: seconds, not minutes of CPU init
        return Qwen2ForCausalLM(cfg).to(dtype=dtype)


def synthetic_batch(vocab: int, B: int, T: int, hint: int, device: Any, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = lambda *shape: torch.randint(0, vocab, shape, generator=g)  # noqa: E731
    prompt = T // 4
    student = ids(B, T)
    response = student[:, prompt:]
    teacher = torch.cat([student[:, :prompt], ids(B, hint), response], 1)
    s_mask = torch.zeros(B, T, dtype=torch.long)
    s_mask[:, prompt:] = 1
    t_mask = torch.zeros(B, T + hint, dtype=torch.long)
    t_mask[:, prompt + hint :] = 1
    half = torch.zeros(B, T, dtype=torch.long)
    half[:, T // 2 :] = 1
    batch = {
        "input_ids": student, "response_mask": s_mask, "attention_mask": torch.ones(B, T, dtype=torch.long),
        "ctx_teacher_input_ids": teacher, "sdpo_loss_mask": t_mask, "sdpo_student_mask": s_mask,
        "dpo_chosen_input_ids": ids(B, T), "dpo_chosen_response_mask": half,
        "dpo_rejected_input_ids": ids(B, T), "dpo_rejected_response_mask": half,
        "dpo_chosen_ref_logprobs": -torch.rand(B, generator=g) * 100,
        "dpo_rejected_ref_logprobs": -torch.rand(B, generator=g) * 100,
    }  # fmt: skip
    return {k: v.to(device) for k, v in batch.items()}


SFT_KEYS = ("input_ids", "response_mask", "attention_mask")


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _peak_gib(device: Any) -> float:
    import resource

    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # process peak RSS (KiB -> GiB)


def time_steps(model: Any, batch: dict, variant: str, repeats: int, device: Any, engine: Any = None) -> dict:
    """Median seconds of ``repeats`` optimizer steps (after one warm-up) and peak memory."""
    import torch

    from composer_replication.trainer.distributed.engine import Engine

    engine = engine or Engine(torch.device(device))
    from composer_replication.loss import ComposedLoss

    if variant == "sft":
        batch = {k: batch[k] for k in SFT_KEYS}
        loss_fn = ComposedLoss.from_config({"sdpo": {"weight": 0.0}, "preference": {"weight": 0.0}})
    else:
        loss_fn = ComposedLoss.from_config({"sdpo": {"weight": 1.0}, "preference": {"weight": 1.0}})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for i in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        comps = engine.loss(model, batch, loss_fn)
        comps.total.backward()
        opt.step()
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
        loss = float(comps.total.detach())
    opt.zero_grad(set_to_none=True)  # the next variant starts without this one's gradients
    from composer_replication.kernels.hf import resolve_logits_mode

    path = resolve_logits_mode(engine.unsharded(model), None, batch["input_ids"])[0]
    tokens = {k: int(v.numel()) for k, v in batch.items() if k.endswith("input_ids")}
    return {"step_s": statistics.median(times), "peak_gib": _peak_gib(device), "loss": loss,
            "tokens": tokens, "logits_path": path}  # fmt: skip


def _flops(n_params: int, tokens: dict[str, int]) -> float:
    """6·N per trained token, 2·N per no-grad (teacher) token."""
    return sum((2 if k == "ctx_teacher_input_ids" else 6) * n_params * n for k, n in tokens.items())


def offline_rows(args: Any) -> list[dict]:
    """``offline-sft``, ``offline-3ch`` and their ratios, in this process."""
    import torch

    device, dtype = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    model = build_model("tiny" if args.tiny else args.model, device, dtype)
    n = sum(p.numel() for p in model.parameters())
    batch = synthetic_batch(model.config.vocab_size, args.B, args.T, args.hint, device, seed=0)
    base = {"model": "tiny" if args.tiny else args.model, "params": n, "dtype": str(dtype).removeprefix("torch."),
            "B": args.B, "T": args.T, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}  # fmt: skip
    rows = []
    for variant in ("sft", "3ch"):
        r = time_steps(model, batch, variant, args.repeats, device)
        train_tokens = args.B * args.T
        rows.append({"row": f"offline-{variant}", **base, **r, "train_tokens_per_s": train_tokens / r["step_s"],
                     "all_tokens_per_s": sum(r["tokens"].values()) / r["step_s"],
                     "tflops": _flops(n, r["tokens"]) / r["step_s"] / 1e12, "status": "ok"})  # fmt: skip
        if device == "cuda":
            torch.cuda.empty_cache()
    sft, three = rows
    rows.append({"row": "offline-3ch-vs-sft", **base, "time_ratio": three["step_s"] / sft["step_s"],
                 "peak_ratio": three["peak_gib"] / sft["peak_gib"], "status": "ok"})  # fmt: skip
    return rows


def ddp_worker(args: Any) -> None:
    """One rank of the 2-process row (run by ``torch.distributed.run``); rank 0 prints its JSON line."""
    import torch
    import torch.distributed as dist

    from composer_replication.config import DistributedConfig
    from composer_replication.trainer.distributed import engine as distributed

    class Cfg:
        distributed = DistributedConfig(strategy="ddp")

    engine = distributed.setup(Cfg(), None if not args.tiny else "cpu")
    device, dtype = (engine.device, torch.float32 if args.tiny else torch.bfloat16)
    model = engine.prepare(build_model("tiny" if args.tiny else args.model, device, dtype))
    batch = synthetic_batch(model.config.vocab_size, args.B, args.T, args.hint, device, seed=1 + engine.rank)
    r = time_steps(model, batch, "3ch", args.repeats, device, engine=engine)
    times = [None] * engine.world_size
    dist.all_gather_object(times, r["step_s"])
    if engine.is_main:
        step = max(times)  # the slowest rank sets the pace
        print(json.dumps({"row": "ddp-3ch", "processes": engine.world_size, **r, "step_s": step,
                          "rank_step_s": times, "agg_train_tokens_per_s": engine.world_size * args.B * args.T / step}))  # fmt: skip
    dist.destroy_process_group()


def ddp_rows(args: Any, one_process: dict | None) -> list[dict]:
    """``ddp-3ch``: 2 processes under torch's launcher (GPUs: needs 2; tiny: CPU, gloo)."""
    import torch

    if not args.tiny and torch.cuda.device_count() < 2:
        return [{"row": "ddp-3ch", "status": f"skipped: needs 2 GPUs, found {torch.cuda.device_count()}"}]
    flags = ["--B", str(args.B), "--T", str(args.T), "--hint", str(args.hint), "--repeats", str(args.repeats),
             "--model", args.model] + (["--tiny"] if args.tiny else [])  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(Path(__file__).with_name("gpu_bench.py")), "--ddp-worker", *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    if args.tiny:
        env.setdefault("OMP_NUM_THREADS", "1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [x for x in p.stdout.splitlines() if x.startswith('{"row": "ddp-3ch"')]
    if p.returncode != 0 or not lines:
        return [{"row": "ddp-3ch", "status": f"failed (exit {p.returncode}): {p.stderr.strip()[-500:]}"}]
    row = json.loads(lines[0]) | {"status": "ok"}
    if one_process is not None:
        single = args.B * args.T / one_process["step_s"]
        row["scaling_efficiency"] = row["agg_train_tokens_per_s"] / (2 * single)
    return [row]
