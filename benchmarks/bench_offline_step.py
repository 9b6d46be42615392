"""Time and peak memory of one offline three-channel step vs a plain SFT step on the same batch.

Each variant runs in its own subprocess (peak RSS is per process), on the same real batch: two traces
from the bundled sessions with a hinted error site (SFT + SDPO) and two recovery preference pairs (DPO,
reference log-probs precomputed as the trainer caches them). The three-channel step shares the
student forward between CE and SDPO (compose_loss), adds one no-grad teacher forward and one
forward+backward over chosen+rejected. FLOPs use the 2·N per token forward / 4·N backward estimate.

    python3 benchmarks/bench_offline_step.py --model tiny
    flock /tmp/bigmem.lock python3 benchmarks/bench_offline_step.py --model default --steps 2
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_batch(model_name: str, max_len: int):
    import torch

    from composer_replication.config import build_config
    from composer_replication.ingestion import ingest_paths
    from composer_replication.trainer import data as od
    from composer_replication.trainer.pair_tokens import pair_batch, reference_logprobs
    from composer_replication.trainer.prepare import load_model

    tmp = Path(tempfile.mkdtemp())
    ingest_paths([ROOT / "tests" / "data" / "sessions"], tmp)
    traces = od.load_rows(tmp / "traces.jsonl")
    pairs = od.recovery_pairs(traces)[:2]
    (tmp / "pairs.jsonl").write_text("")
    cfg = build_config({"model": {"path": model_name}, "data": {"pairs": str(tmp / "pairs.jsonl")}})
    model, tok = load_model(cfg, torch.device("cpu"))
    collator = od.make_collator(tok, max_len, max_len, True)
    sites = [
        t for t in traces if od.trace_batch(collator, [t]).get("sdpo_loss_mask", torch.zeros(1, 1)).sum() > 0
    ]
    batch = od.trace_batch(collator, sites[:2])
    ref = reference_logprobs(model, tok, pairs, max_len)
    batch.update(pair_batch(tok, pairs, ref, max_len, torch.device("cpu")))
    return model, batch


def flops(n_params: int, batch, variant: str) -> float:
    tokens = lambda key: float(batch[key].numel())  # noqa: E731  (padded tokens: what the matmuls see)
    f = 6 * n_params * tokens("input_ids")
    if variant == "three":
        f += 2 * n_params * tokens("ctx_teacher_input_ids")
        f += 6 * n_params * (tokens("dpo_chosen_input_ids") + tokens("dpo_rejected_input_ids"))
    return f


def child(args) -> None:
    import torch

    from composer_replication.loss import compose_loss

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, batch = build_batch(args.model, args.max_len)
    if args.variant == "sft":
        batch = {k: batch[k] for k in ("input_ids", "attention_mask", "response_mask")}
    kw = (
        dict(alpha_sdpo=0.1, beta_replay=0.05)
        if args.variant == "three"
        else dict(alpha_sdpo=0.0, beta_replay=0.0)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step():
        opt.zero_grad(set_to_none=True)
        compose_loss(model, batch, **kw).total.backward()
        opt.step()

    step()  # warm-up: allocates optimizer state and autograd buffers
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    n = sum(p.numel() for p in model.parameters())
    shapes = {k: list(v.shape) for k, v in batch.items() if v.dim() == 2}
    print(json.dumps({"variant": args.variant, "median_s": statistics.median(times), "peak_rss_mb": peak / 1024,
                      "rss_growth_mb": (peak - rss_before) / 1024, "flops": flops(n, batch, args.variant),
                      "params": n, "shapes": shapes}))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | default (SmolLM2-135M)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", choices=["sft", "three"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.variant:
        return child(args)
    res = {}
    for variant in ("sft", "three"):
        cmd = [sys.executable, __file__, "--variant", variant, "--model", args.model, "--steps", str(args.steps),
               "--max-len", str(args.max_len), "--threads", str(args.threads)]  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        res[variant] = json.loads(out)
    s, t = res["sft"], res["three"]
    print(
        f"model={args.model} params={s['params']:,} threads={args.threads} steps={args.steps} shapes={t['shapes']}"
    )
    print("| step | median time (s) | peak RSS (MB) | FLOPs (est.) |")
    print("|---|---|---|---|")
    print(f"| plain SFT | {s['median_s']:.3f} | {s['peak_rss_mb']:.0f} | {s['flops']:.3g} |")
    print(f"| SFT + SDPO + DPO | {t['median_s']:.3f} | {t['peak_rss_mb']:.0f} | {t['flops']:.3g} |")
    print(f"| ratio | {t['median_s'] / s['median_s']:.2f}x | {t['peak_rss_mb'] / s['peak_rss_mb']:.2f}x "
          f"| {t['flops'] / s['flops']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
