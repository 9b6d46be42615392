"""GPU version of bench_gjsd.py: the same variants, peak CUDA memory, CUDA-event times, bandwidth.

Variants (each in a fresh ``torch.cuda.reset_peak_memory_stats`` window, one process):

- ``naive``: `opsd.generalized_jsd_loss` on (B, T, V) fp32 logits;
- ``naive-linear``: the same reference loss from hidden states + LM head (``F.linear`` to full
  student logits, teacher logits under no_grad): the like-for-like baseline for the fused variants;
- ``chunked``: `losses.gjsd.chunked_generalized_jsd_loss` on the same logits;
- ``fused``: `losses.gjsd.fused_generalized_jsd_loss` on hidden states + LM head;
- ``trl``: TRL 1.16 ``ChunkedDivergenceFunction`` (Triton on CUDA), via `kernels.triton_liger`;
- ``liger``: Liger-Kernel ``LigerFusedLinearJSDLoss`` (skipped when not installed).

Reported per variant: forward / backward milliseconds (CUDA events, median of ``--repeats`` after
one warm-up), peak ``torch.cuda.max_memory_allocated`` and the part above the inputs, and the
achieved bandwidth on the minimal logits traffic (logits-in variants: read both logits, write the
gradient = 3·N·V·4 bytes) as a fraction of the device's copy bandwidth, measured by a 2 GiB
device-to-device copy. Fused variants report TFLOP/s of their projections instead.

    python3 benchmarks/gpu_bench.py --T 4096 --out /tmp/gpu_gjsd.json

Suites (``--suites``, default all): ``gjsd`` (the variants above), ``offline`` (one optimizer step of the
trainer's three-channel loss on a ``--model`` built from its config with random weights, bf16, vs a plain
SFT step: tokens/s, peak memory; see ``_offline_step_rows.py``) and ``ddp`` (the same step on 2 GPUs
through the trainer's DDP engine; skipped with fewer). Every row is printed as one JSON line.

    python3 benchmarks/gpu_bench.py --suites offline,ddp --model 1.5b --T 2048

``--dry-run`` parses arguments and prints the plan without touching CUDA (used by the CPU tests).
``--tiny`` runs the offline and ddp suites end to end on the CPU with the tiny model (2 gloo processes):
the numbers mean nothing, but the script is known to work before a GPU is lent.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

VARIANTS = ("naive", "naive-linear", "chunked", "fused", "trl", "liger")
SUITES = ("gjsd", "offline", "ddp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--V", type=int, default=151936)
    p.add_argument("--H", type=int, default=896)
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="hidden/weight dtype")
    p.add_argument("--out", default=None)
    p.add_argument("--dry-run", action="store_true", help="print the plan; do not use CUDA")
    p.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, from {SUITES}")
    p.add_argument(
        "--model", default="1.5b", choices=["0.5b", "1.5b", "7b"], help="offline/ddp: Qwen2.5 config"
    )
    p.add_argument("--hint", type=int, default=64, help="offline/ddp: hint tokens in the teacher rows")
    p.add_argument("--tiny", action="store_true", help="offline/ddp on the CPU with the tiny model")
    p.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; choose from {VARIANTS}")
    bad = [v for v in args.suites.split(",") if v not in SUITES]
    if bad:
        p.error(f"unknown suites {bad}; choose from {SUITES}")
    if args.tiny:
        args.suites = ",".join(x for x in args.suites.split(",") if x != "gjsd")
        args.T = min(args.T, 64)
    return args


def copy_bandwidth_gbs(torch, nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth (read + write bytes per second), GB/s."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * nbytes / min(times) / 1e9


def _loss_fn(variant: str, beta: float):
    from composer_replication.kernels.fused_linear import LMHead
    from composer_replication.kernels.triton_liger import gpu_fused_gjsd
    from composer_replication.losses.gjsd import chunked_generalized_jsd_loss, fused_generalized_jsd_loss
    from composer_replication.opsd import generalized_jsd_loss

    def naive_linear(lab, hs, ht, w):
        import torch
        import torch.nn.functional as F

        zs = F.linear(hs, w).float()
        with torch.no_grad():
            zt = F.linear(ht, w).float()
        return generalized_jsd_loss(zs, zt, lab, beta=beta)

    return {
        "naive": lambda lab, s, t: generalized_jsd_loss(s, t, lab, beta=beta),
        "naive-linear": naive_linear,
        "chunked": lambda lab, s, t: chunked_generalized_jsd_loss(s, t, lab, beta=beta),
        "fused": lambda lab, hs, ht, w: fused_generalized_jsd_loss(hs, ht, LMHead(w), lab, beta=beta),
        "trl": lambda lab, hs, ht, w: gpu_fused_gjsd(hs, ht, LMHead(w), lab, beta, backend="trl"),
        "liger": lambda lab, hs, ht, w: gpu_fused_gjsd(hs, ht, LMHead(w), lab, beta, backend="liger"),
    }[variant]


def run_variant(torch, args, variant: str, copy_gbs: float) -> dict:
    B, T, V, H = args.B, args.T, args.V, args.H
    dev = "cuda"
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    lab = torch.randint(0, V, (B, T), device=dev)
    lab[:, : T // 8] = -100
    logits_in = variant in ("naive", "chunked")
    if logits_in:
        xs = [(2 * torch.randn(B, T, V, device=dev)).requires_grad_(), 2 * torch.randn(B, T, V, device=dev)]
    else:
        w = (torch.randn(V, H, device=dev) * 2 / H**0.5).to(dtype).requires_grad_()
        xs = [
            torch.randn(B, T, H, device=dev, dtype=dtype).requires_grad_(),
            torch.randn(B, T, H, device=dev, dtype=dtype),
            w,
        ]
    fn = _loss_fn(variant, args.beta)
    fwd, bwd, peak, above = [], [], 0, 0
    for i in range(args.repeats + 1):
        for x in xs:
            x.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        loss = fn(lab, *xs)
        e1.record()
        loss.backward()
        e2.record()
        torch.cuda.synchronize()
        if i == 0:
            continue  # warm-up (Triton compilation, allocator)
        fwd.append(e0.elapsed_time(e1))
        bwd.append(e1.elapsed_time(e2))
        peak = max(peak, torch.cuda.max_memory_allocated())
        above = max(above, torch.cuda.max_memory_allocated() - base)
    total_s = (statistics.median(fwd) + statistics.median(bwd)) / 1e3
    n = int((lab != -100).sum())
    res = {
        "variant": variant,
        "forward_ms": statistics.median(fwd),
        "backward_ms": statistics.median(bwd),
        "peak_gib": peak / 2**30,
        "above_inputs_gib": above / 2**30,
        "loss": float(loss),
    }
    if logits_in:
        gbs = 3 * B * T * V * 4 / total_s / 1e9
        res.update({"achieved_gbs": gbs, "fraction_of_copy_bw": gbs / copy_gbs})
    else:
        res["projection_tflops"] = 4 * 2 * n * V * H / total_s / 1e12  # 2 fwd + 2 bwd GEMMs
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    variants = args.variants.split(",")
    suites = args.suites.split(",")
    if args.dry_run:
        print(json.dumps({"plan": variants, "shape": [args.B, args.T, args.V, args.H], "dtype": args.dtype,
                          "suites": suites, "model": "tiny" if args.tiny else args.model}))  # fmt: skip
        return 0
    import _offline_step_rows as osr

    if args.ddp_worker:
        osr.ddp_worker(args)
        return 0
    import torch

    if not args.tiny and not torch.cuda.is_available():
        print("gpu_bench.py needs a CUDA device (--tiny runs on the CPU; --dry-run checks the arguments)",
              file=sys.stderr)  # fmt: skip
        return 2
    rows: list[dict] = []
    if "offline" in suites or "ddp" in suites:
        offline = osr.offline_rows(args)
        if "offline" in suites:
            rows += offline
        if "ddp" in suites:
            rows += osr.ddp_rows(args, next(r for r in offline if r["row"] == "offline-3ch"))
        for r in rows:
            print(json.dumps(r), flush=True)
    if "gjsd" in suites:
        rows += gjsd_rows(args, torch, variants)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


def gjsd_rows(args, torch, variants: list[str]) -> list[dict]:
    """The GJSD variants: one JSON line each on stdout, the markdown table on stderr."""
    from composer_replication.kernels.triton_liger import available_backends

    have = set(available_backends())
    copy_gbs = copy_bandwidth_gbs(torch)
    results = []
    for v in variants:
        if v in ("trl", "liger") and v not in have:
            results.append({"variant": v, "status": "skipped: backend not installed"})
            continue
        try:
            results.append(run_variant(torch, args, v, copy_gbs) | {"status": "ok"})
        except torch.cuda.OutOfMemoryError:
            results.append({"variant": v, "status": "out of memory"})
        torch.cuda.empty_cache()
    for r in results:
        print(json.dumps({"row": f"gjsd-{r['variant']}", "copy_gbs": copy_gbs, **r}), flush=True)
    table = [f"device: {torch.cuda.get_device_name()}  copy bandwidth: {copy_gbs:.0f} GB/s",
             "| variant | fwd ms | bwd ms | peak GiB | above inputs GiB | GB/s (frac of copy) | TFLOP/s |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        if r["status"] != "ok":
            table.append(f"| {r['variant']} | {r['status']} | | | | | |")
            continue
        bw = f"{r['achieved_gbs']:.0f} ({r['fraction_of_copy_bw']:.2f})" if "achieved_gbs" in r else ""
        tf = f"{r['projection_tflops']:.1f}" if "projection_tflops" in r else ""
        table.append(
            f"| {r['variant']} | {r['forward_ms']:.1f} | {r['backward_ms']:.1f} | {r['peak_gib']:.2f} | "
            f"{r['above_inputs_gib']:.2f} | {bw} | {tf} |"
        )
    print("\n".join(table), file=sys.stderr)
    return [{"row": f"gjsd-{r['variant']}", "copy_gbs": copy_gbs, **r} for r in results]


if __name__ == "__main__":
    raise SystemExit(main())
