"""Peak memory of one offline three-channel step on SmolLM2-135M: full logits vs the fused path.

One step = ``compose_loss`` with all three channels on (LM cross-entropy on the rollout; SDPO
generalized JSD against the same model given a hint context; DPO on a chosen/rejected pair with
precomputed reference log-probs), forward + backward, on the default small model
(``models.load_default_model()``, SmolLM2-135M-Instruct, V = 49152), B = 1, every sequence
``--T`` tokens. Each mode (``full`` = reference path, ``chunked``, ``fused``) runs in its own
subprocess; we report the peak RSS, the RSS after loading the model, and the difference (the step's
own memory), and the step time.

    flock /tmp/bigmem.lock python3 benchmarks/bench_offline_memory.py --T 2048 --out /tmp/offline_mem.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

GiB = 2**30


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def make_batch(T: int, V: int, seed: int = 0):
    """A synthetic three-channel batch with the shapes `batch.build_batch` produces."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt, hint = T // 4, 64

    def ids(n):
        return torch.randint(100, V, (1, n), generator=g)

    p, r = ids(prompt), ids(T - prompt)
    student = torch.cat([p, r], 1)
    response_mask = torch.cat(
        [torch.zeros(1, prompt, dtype=torch.long), torch.ones(1, T - prompt, dtype=torch.long)], 1
    )
    teacher = torch.cat([p, ids(hint), r], 1)
    sdpo_mask = torch.cat(
        [torch.zeros(1, prompt + hint, dtype=torch.long), torch.ones(1, T - prompt, dtype=torch.long)], 1
    )
    chosen = torch.cat([p, ids(T - prompt)], 1)
    rejected = torch.cat([p, ids(T - prompt)], 1)
    return {
        "input_ids": student,
        "response_mask": response_mask,
        "ctx_teacher_input_ids": teacher,
        "sdpo_loss_mask": sdpo_mask,
        "dpo_chosen_input_ids": chosen,
        "dpo_chosen_response_mask": response_mask.clone(),
        "dpo_rejected_input_ids": rejected,
        "dpo_rejected_response_mask": response_mask.clone(),
        "dpo_chosen_ref_logprobs": torch.tensor([-3.0 * (T - prompt)]),
        "dpo_rejected_ref_logprobs": torch.tensor([-3.1 * (T - prompt)]),
    }


def worker(mode: str, T: int, threads: int) -> dict:
    import torch

    from composer_replication.loss import compose_loss
    from composer_replication.models import load_default_model

    torch.set_num_threads(threads)
    loaded = load_default_model()
    model = loaded[0] if isinstance(loaded, tuple) else loaded
    model.train()
    V = model.get_output_embeddings().weight.shape[0]
    batch = make_batch(T, V)
    # Warm-up on a short batch (first-call imports, allocator), then measure from here.
    compose_loss(model, make_batch(32, V, seed=1), logits_mode=mode).total.backward()
    model.zero_grad(set_to_none=True)
    base = _rss()
    t0 = time.perf_counter()
    out = compose_loss(model, batch, logits_mode=mode)
    t1 = time.perf_counter()
    out.total.backward()
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "mode": mode,
        "T": T,
        "V": V,
        "components": out.detached(),
        "forward_s": t1 - t0,
        "backward_s": t2 - t1,
        "base_rss_gib": base / GiB,
        "peak_rss_gib": peak / GiB,
        "step_gib": (peak - base) / GiB,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--T", type=int, default=2048)
    p.add_argument("--modes", default="full,fused")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.T, args.threads)))
        return 0
    results = []
    for mode in args.modes.split(","):
        print(f"[bench] {mode} T={args.T} ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--worker", mode, "--T", str(args.T), "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            results.append(
                {"mode": mode, "T": args.T, "status": f"failed (rc={proc.returncode}): {tail[:200]}"}
            )
        else:
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]) | {"status": "ok"})
        print(f"[bench] {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    base = next((r for r in results if r["mode"] == "full" and r["status"] == "ok"), None)
    print(
        "| mode | T | step time s | peak RSS GiB | RSS after model GiB | step memory GiB | vs full | total loss |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["status"] != "ok":
            print(f"| {r['mode']} | {r['T']} | {r['status']} | | | | | |")
            continue
        ratio = f"{r['step_gib'] / base['step_gib']:.2f}×" if base else ""
        print(
            f"| {r['mode']} | {r['T']} | {r['forward_s'] + r['backward_s']:.1f} | {r['peak_rss_gib']:.2f} | "
            f"{r['base_rss_gib']:.2f} | {r['step_gib']:.2f} | {ratio} | {r['components']['total']:.4f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
