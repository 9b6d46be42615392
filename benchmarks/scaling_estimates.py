"""The derived numbers of docs/scaling.md, from the measured ones (each constant says where it was measured).

    python3 benchmarks/scaling_estimates.py            # markdown tables
    python3 benchmarks/scaling_estimates.py --json     # the same numbers as JSON

Nothing here runs a model: it is arithmetic on measured constants and stated assumptions, so that every
derived number in the doc can be recomputed (and replaced once ``gpu_bench.py`` has run on a GPU).
"""

from __future__ import annotations

import argparse
import json

GB = 1e9

# Qwen2.5 public configs: hidden h, intermediate i, layers L, vocab V, kv width, tied embeddings
MODELS = {
    "7B": dict(h=3584, i=18944, L=28, V=152064, kv=512, tied=False),
    "32B": dict(h=5120, i=27648, L=64, V=152064, kv=1024, tied=False),
}

# --- measured here (docs/benchmarks/*.md) ---
SMOL = dict(h=576, i=1536, L=30, params=134.5e6)  # SmolLM2-135M
SMOL_STEP_GIB = 8.19  # largevocab.md: fused three-channel step memory, T=2048, B=1, fp32 (3 grad sequences)
SMOL_GRAD_GIB = 134.5e6 * 4 / 2**30  # its fp32 gradients, part of that step memory
THREE_VS_SFT_FLOPS, THREE_VS_SFT_TIME = 3.41, 3.65  # training.md: SmolLM2, T~500, CPU
INGEST_MBS, INGEST_MB, INGEST_STATES, INGEST_ERRORS = 6.3, 193.3, 25_098, 940  # ingestion.md
REPLAY_OF_IDEAL = 0.909  # replay.md: calls/s over concurrency/latency
ALLREDUCE_OVER_RAW = {"SeaweedFS": 1.31, "moto": 2.11, "local dir": 3.30}  # diloco.md, 135M fp32, 4 replicas

# --- assumptions (stated in the doc) ---
H100_BF16_TFLOPS = 989.0  # dense bf16 peak, H100 SXM
MFU = 0.40  # assumed model-FLOPs utilisation until gpu_bench.py measures ours
STORE_GBS = 2.0  # assumed per-node throughput to an object store (GB/s)


def params(m: dict) -> float:
    h, i, L, V, kv = m["h"], m["i"], m["L"], m["V"], m["kv"]
    layer = 2 * h * h + 2 * h * kv + 3 * h * i + (h + 2 * kv)  # q, o, k, v, MLP, qkv biases (norms ~0)
    return L * layer + V * h * (1 if m["tied"] else 2)


def act_bytes_per_token_layer(h: int, i: int, elem: int) -> float:
    """Activations kept for backward per token and layer, calibrated on the measured SmolLM2 step and
    scaled by (2h + 3i): residual/attention streams ~h, SwiGLU gate/up/product ~i."""
    smol_tokens = 3 * 2048 * SMOL["L"]
    per_unit = (SMOL_STEP_GIB - SMOL_GRAD_GIB) * 2**30 / smol_tokens / (2 * SMOL["h"] + 3 * SMOL["i"]) / 4
    return per_unit * (2 * h + 3 * i) * elem


def memory_rows(ranks: int = 8, T: int = 4096, B: int = 1) -> list[dict]:
    rows = []
    for name, m in MODELS.items():
        n = params(m)
        root = m["V"] * m["h"] * (1 if m["tied"] else 2)  # embeddings + head: FSDP2 root, unsharded per step
        layer = (n - root) / m["L"]
        tokens = 3 * B * T  # student, chosen, rejected carry gradients; the hinted teacher does not
        act = act_bytes_per_token_layer(m["h"], m["i"], 2) * m["L"] * tokens
        act_ckpt = tokens * (m["L"] * m["h"] * 2 + act_bytes_per_token_layer(m["h"], m["i"], 2))
        for master in ("bf16", "fp32 master"):
            state = (8 if master == "bf16" else 16) * n / ranks  # params + grads + 2 AdamW moments
            transient = 2 * root * 2 + 2 * layer * 2  # root params + grads (bf16), two layers gathered
            rows.append({
                "model": name, "params_B": n / 1e9, "ranks": ranks, "weights": master,
                "sharded_state_GB": state / GB, "gathered_GB": transient / GB,
                "activations_GB": act / GB, "activations_ckpt_GB": act_ckpt / GB,
                "total_ckpt_GB": (state + transient + act_ckpt) / GB + 1.0,  # + ~1 GB loss/kernel workspace
            })  # fmt: skip
    return rows


def throughput_rows() -> list[dict]:
    rows = []
    for name, m in MODELS.items():
        n = params(m)
        sft = MFU * H100_BF16_TFLOPS * 1e12 / (6 * n)
        rows.append({
            "model": name, "sft_tok_s_gpu": sft, "three_ch_tok_s_gpu": sft / THREE_VS_SFT_FLOPS,
            "three_ch_ckpt_tok_s_gpu": sft / THREE_VS_SFT_FLOPS * 6 / 8,  # recompute adds 2N per trained token
            "three_ch_tok_s_node": 8 * sft / THREE_VS_SFT_FLOPS,
        })  # fmt: skip
    return rows


def diloco_rows(replicas: int = 4, H: int = 500, tokens_per_step: int = 8 * 4096) -> list[dict]:
    rows = []
    for (name, m), tp in zip(MODELS.items(), throughput_rows()):
        obj = 4 * params(m)  # fp32 pseudo-gradient object, as the measured 538 MB for 134.5M
        traffic = replicas * obj  # one PUT + (k-1) GETs per replica per round
        raw_s = traffic / (STORE_GBS * GB)
        step_s = tokens_per_step / tp["three_ch_tok_s_node"]
        rows.append({
            "model": name, "object_GB": obj / GB, "traffic_per_round_GB": traffic / GB, "raw_s": raw_s,
            "round_s": {k: raw_s * r for k, r in ALLREDUCE_OVER_RAW.items()},
            "inner_steps_s": H * step_s, "step_s": step_s,
            "ddp_allreduce_GB_per_step": 2 * 2 * params(m) / GB,  # ring: 2x the bf16 gradients per step
        })  # fmt: skip
    return rows


def replay_rows() -> list[dict]:
    out = []
    for latency, conc, rpm in ((10, 32, 1000), (10, 128, 1000), (30, 32, 4000)):
        cps = min(REPLAY_OF_IDEAL * conc / latency, rpm / 60)
        out.append({"latency_s": latency, "concurrency": conc, "rpm_limit": rpm, "calls_s": cps,
                    "bound": "concurrency" if cps < rpm / 60 else "rate limit",
                    "concurrency_to_saturate": rpm / 60 * latency / REPLAY_OF_IDEAL})  # fmt: skip
    return out


def ingest_rows(gb: float = 10.0) -> dict:
    mb = gb * 1000
    return {"GB": gb, "minutes_one_process": mb / INGEST_MBS / 60, "states": mb / INGEST_MB * INGEST_STATES,
            "tool_errors": mb / INGEST_MB * INGEST_ERRORS, "peak_rss_MB": 33}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    data = {"memory": memory_rows(), "throughput": throughput_rows(), "diloco": diloco_rows(),
            "replay": replay_rows(), "ingest": ingest_rows()}  # fmt: skip
    if args.json:
        print(json.dumps(data, indent=1))
        return
    for section, rows in data.items():
        rows = rows if isinstance(rows, list) else [rows]
        print(f"\n## {section}\n")
        keys = list(rows[0])
        print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
        for r in rows:
            cells = [
                f"{v:,.1f}" if isinstance(v, float) else (", ".join(f"{a} {b:,.0f}" for a, b in v.items()) if isinstance(v, dict) else str(v))
                for v in r.values()
            ]  # fmt: skip
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
