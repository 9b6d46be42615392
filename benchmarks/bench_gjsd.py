"""Generalized JSD at a large vocabulary: naive vs chunked vs fused-linear vs TRL's chunked kernel.

Each variant runs in its own subprocess (so peak RSS is its own), one after another in a single
invocation, and reports forward and backward time and memory:

- ``naive``: the reference path `opsd.generalized_jsd_loss` on (B, T, V) fp32 logits (two
  log-softmaxes, a log-space mixture, two KLs: what TRL's ``compute_divergence`` does);
- ``naive-linear``: the same reference loss, starting from the hidden states and the LM head
  (``F.linear`` to full student logits with gradient, teacher logits under no_grad, as an SDPO step
  computes them): the like-for-like baseline for ``fused``, which starts from the same inputs;
- ``chunked``: `losses.gjsd.chunked_generalized_jsd_loss` on the same logits;
- ``fused``: `losses.gjsd.fused_generalized_jsd_loss` on hidden states (B, T, H) and the
  (V, H) LM head, so no logits tensor ever exists;
- ``trl``: TRL 1.16's ``trl.kernels.chunked_divergence.ChunkedDivergenceFunction`` on the same
  hidden states and head (pure-torch tiles on CPU).

Usage (the numbers in docs/benchmarks/largevocab.md)::

    flock /tmp/bigmem.lock python3 benchmarks/bench_gjsd.py --T 1024 --out /tmp/gjsd_1024.json

Memory safety: before the ``naive`` variant the parent checks ``MemAvailable`` and only starts it
when the estimate (16 logits tensors) plus a margin fits; the child runs under ``RLIMIT_AS`` so it
fails with an allocation error rather than taking the machine down. A killed or skipped run is
reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GiB = 2**30


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_s() -> float:
    """User + system CPU seconds of this process (robust to other load on a shared machine)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _variant_fn(v: str, beta: float, V: int, H: int):
    """loss(labels, *inputs) for one variant (imports done here, outside the timed region)."""
    if v == "naive":
        from composer_replication.opsd import generalized_jsd_loss

        return lambda lab, s, t: generalized_jsd_loss(s, t, lab, beta=beta)
    if v == "naive-linear":
        import torch
        import torch.nn.functional as F

        from composer_replication.opsd import generalized_jsd_loss

        def naive_linear(lab, hs, ht, w):
            zs = F.linear(hs, w)
            with torch.no_grad():
                zt = F.linear(ht, w)
            return generalized_jsd_loss(zs, zt, lab, beta=beta)

        return naive_linear
    if v == "chunked":
        from composer_replication.losses.gjsd import chunked_generalized_jsd_loss

        return lambda lab, s, t: chunked_generalized_jsd_loss(s, t, lab, beta=beta)
    if v == "fused":
        from composer_replication.kernels.fused_linear import LMHead
        from composer_replication.losses.gjsd import fused_generalized_jsd_loss

        return lambda lab, hs, ht, w: fused_generalized_jsd_loss(hs, ht, LMHead(w), lab, beta=beta)
    if v == "trl":
        from trl.kernels.chunked_divergence import ChunkedDivergenceFunction

        def trl_fn(lab, hs, ht, w):
            # TRL's DistillationTrainer projects only the unmasked positions, then takes their mean.
            keep = (lab != -100).reshape(-1)
            h_s, h_t = hs.reshape(-1, H)[keep], ht.reshape(-1, H)[keep]
            per_token, _ = ChunkedDivergenceFunction.apply(h_s, w, None, h_t, w.detach(), None, beta)
            return per_token.mean()

        return trl_fn
    raise ValueError(f"unknown variant {v!r}")


def worker(args: argparse.Namespace) -> dict:
    """Run one variant in this process and return its measurements."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, V, H = args.B, args.T, args.V, args.H
    v = args.variant

    def make(b: int, t_: int, V: int = V):
        lab = torch.randint(0, V, (b, t_))
        lab[:, : t_ // 8] = -100  # a prompt-like prefix that the loss ignores
        if v in ("naive", "chunked"):
            # In-place scaling: no temporary copy inflates the peak before the measurement starts.
            return lab, [torch.randn(b, t_, V).mul_(2.0).requires_grad_(), torch.randn(b, t_, V).mul_(2.0)]
        w_ = torch.randn(V, H).mul_(2.0 / H**0.5).requires_grad_()
        return lab, [torch.randn(b, t_, H).requires_grad_(), torch.randn(b, t_, H), w_]

    fn = _variant_fn(v, args.beta, V, H)
    # Warm-up, small so it cannot set the peak: first-call imports and lazy init stay out of the timing.
    lab, xs = make(1, 8, min(V, 4096))
    fn(lab, *xs).backward()
    del lab, xs
    labels, xs = make(B, T)
    inputs = [x for x in xs if x.requires_grad]
    base_rss = _rss_bytes()
    c0, t0 = _cpu_s(), time.perf_counter()
    loss = fn(labels, *xs)
    c1, t1 = _cpu_s(), time.perf_counter()
    loss.backward()
    c2, t2 = _cpu_s(), time.perf_counter()
    # Peak first: isfinite() on a (B, T, V) gradient builds an fp32 abs() copy plus two bool masks,
    # which (ru_maxrss being a lifetime peak) used to count as the loss's memory.
    peak = _peak_rss_bytes()
    grad_ok = all(x.grad is not None and bool(torch.isfinite(x.grad).all()) for x in inputs)
    return {
        "variant": v,
        "B": B,
        "T": T,
        "V": V,
        "H": H if v in ("fused", "trl", "naive-linear") else None,
        "loss": float(loss),
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "total_s": t2 - t0,
        "forward_cpu_s": c1 - c0,
        "backward_cpu_s": c2 - c1,
        "total_cpu_s": c2 - c0,
        "inputs_rss_gib": base_rss / GiB,
        "peak_rss_gib": peak / GiB,
        "above_inputs_gib": (peak - base_rss) / GiB,
        "grad_finite": grad_ok,
        "threads": args.threads,
    }


def naive_estimate_bytes(B: int, T: int, V: int) -> int:
    """~16 (B, T, V) fp32 tensors at peak (platform.md §11: 18.5 GB at B=2, T=1024, V=151936)."""
    return 16 * B * T * V * 4


def run_variant(args: argparse.Namespace, variant: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", variant]
    for k in ("B", "T", "V", "H", "beta", "threads"):
        cmd += [f"--{k}", str(getattr(args, k))]
    limit = None
    if variant in ("naive", "naive-linear"):
        need = naive_estimate_bytes(args.B, args.T, args.V)
        for attempt in range(args.retries + 1):
            avail = mem_available_bytes()
            if avail >= need + args.margin_gib * GiB:
                break
            if attempt == args.retries:
                return {
                    "variant": variant,
                    "T": args.T,
                    "status": f"skipped: needs ~{need / GiB:.1f} GiB + {args.margin_gib} GiB margin, "
                    f"{avail / GiB:.1f} GiB available",
                }
            print(f"[bench] naive waits for memory ({avail / GiB:.1f} GiB available)", file=sys.stderr)
            time.sleep(args.retry_wait_s)
        limit = int(args.as_limit_gib * GiB)

    def _limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_limit, env={**os.environ})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
        return {"variant": variant, "T": args.T, "status": f"failed (rc={proc.returncode}): {tail[0][:200]}"}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["status"] = "ok"
    res["wall_s"] = wall
    return res


def table(results: list[dict]) -> str:
    """Markdown table; ratios are against ``naive`` and ``naive-linear`` (peak RSS, and CPU time)."""

    def ok(name):
        return next((r for r in results if r.get("variant") == name and r.get("status") == "ok"), None)

    bases = [b for b in (ok("naive"), ok("naive-linear")) if b is not None]
    head = "".join(f" peak vs {b['variant']} | CPU time vs {b['variant']} |" for b in bases)
    rows = [
        "| variant | T | input | fwd s | bwd s | total s | CPU s | peak RSS GiB | above inputs GiB |" + head,
        "|---|---|---|---|---|---|---|---|---|" + "---|---|" * len(bases),
    ]
    for r in results:
        if r.get("status") != "ok":
            rows.append(f"| {r['variant']} | {r['T']} | | | | | | {r['status']} | |" + " | |" * len(bases))
            continue
        inp = "logits (B,T,V)" if r["H"] is None else f"hidden H={r['H']} + head"
        ratios = "".join(
            f" {r['peak_rss_gib'] / b['peak_rss_gib']:.3f}× | {r['total_cpu_s'] / b['total_cpu_s']:.2f}× |"
            for b in bases
        )
        rows.append(
            f"| {r['variant']} | {r['T']} | {inp} | {r['forward_s']:.1f} | {r['backward_s']:.1f} | "
            f"{r['total_s']:.1f} | {r['total_cpu_s']:.1f} | {r['peak_rss_gib']:.2f} | {r['above_inputs_gib']:.2f} |"
            + ratios
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--V", type=int, default=151936)
    p.add_argument("--H", type=int, default=896, help="hidden width for fused/trl (Qwen2.5-0.5B: 896)")
    p.add_argument("--beta", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = steadier numbers)")
    p.add_argument("--variants", default="naive,naive-linear,chunked,fused,trl")
    p.add_argument("--as-limit-gib", type=float, default=22.0, help="RLIMIT_AS for the naive child")
    p.add_argument("--margin-gib", type=float, default=2.0)
    p.add_argument("--retries", type=int, default=0)
    p.add_argument("--retry-wait-s", type=float, default=60.0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        args.variant = args.worker
        print(json.dumps(worker(args)))
        return 0
    results = []
    for v in args.variants.split(","):
        print(f"[bench] {v} T={args.T} ...", file=sys.stderr, flush=True)
        r = run_variant(args, v.strip())
        print(f"[bench] {json.dumps(r)}", file=sys.stderr, flush=True)
        results.append(r)
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"args": {k: v for k, v in vars(args).items() if k != "worker"}, "results": results},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
