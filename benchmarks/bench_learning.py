"""Does the recipe teach? Channel ablations trained on some sessions, measured on whole other sessions.

Ingests ``--train-sessions`` and ``--eval-sessions`` (two folders of Claude Code / Codex logs; keep every
session, and its resumed copies, on one side), trains one LoRA adapter per (variant, seed) on the first
with the offline trainer's own stepper, and measures each at the error sites of the second
(``trainer.evaluation.sites``: recovery CE, JSD to the hinted teacher, greedy valid-action and tool-match rates,
held-out preference accuracy) and on the bundled sandbox tasks (mean reward and pass rate of one greedy
rollout per task). Writes ``{"variants": {NAME: {METRIC: {"mean", "std", "n"}}}, "config": {...}}``;
``n`` is the number of seeds (the base model is measured once). Finished runs are cached in
``<out>.runs.jsonl`` (keyed by their settings), so a rerun only does what is missing.

    flock /work/coord/heavy.lock python3 benchmarks/bench_learning.py \\
        --train-sessions src/composer_replication/data/learning_sessions/train \\
        --eval-sessions src/composer_replication/data/learning_sessions/eval \\
        --out benchmarks/results/learning.json --seeds 3
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]

# Each variant: the loss channels it trains with (None: not trained), and whether a GRPO phase follows.
VARIANTS: dict[str, dict[str, Any] | None] = {
    "base": None,
    "sft": {"sdpo": False, "dpo": False},
    "sft+sdpo_recorded": {"sdpo": True, "source": "recorded", "dpo": False},
    "sft+sdpo_on_policy": {"sdpo": True, "source": "on_policy", "dpo": False},
    "sft+sdpo+dpo": {"sdpo": True, "dpo": True},
    "sft+sdpo+dpo+grpo": {"sdpo": True, "dpo": True, "grpo": True},
}
METRICS = (
    "recovery_ce",
    "hinted_jsd",
    "valid_rate",
    "tool_match_rate",
    "pref_accuracy",
    "sandbox_reward",
    "sandbox_pass_rate",
)
# Reported beside the metrics (not choosable): answers cut by the token budget (never valid), answers that
# parse whether cut or not (the valid-action rate before cut answers counted invalid), valid answers holding a
# tool call (a prose answer is a valid action too), and the hinted teacher's own recovery CE (what the SDPO
# channel can pass on at best).
DIAGNOSTICS = ("truncated_rate", "well_formed_rate", "tool_call_rate", "teacher_recovery_ce")


def fail(msg: str) -> None:
    print(f"bench_learning.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from composer_replication.config.loss import RPO_ALPHA

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-sessions", required=True, help="folder of training session logs")
    p.add_argument("--eval-sessions", required=True, help="folder of held-out session logs")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--seeds", type=int, default=3, help="training seeds per variant (default 3)")
    p.add_argument("--quick", action="store_true", help="one seed")
    p.add_argument(
        "--model", default="default", help="default (SmolLM2-135M-Instruct), tiny, or a model directory"
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="weights and compute, training and measuring (bfloat16: ~2.8x faster matmuls on CPUs "
                   "with AVX512-BF16 or AMX, several times slower on CPUs without them)")  # fmt: skip
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of the variants")
    p.add_argument("--metrics", default=",".join(METRICS), help="comma-separated subset of the metrics")
    p.add_argument("--steps", type=int, default=24, help="optimizer steps per training run")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (LoRA)")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-layers", type=int, default=8,
                   help="adapt only the last N transformer layers (backward stops below them); 0 = all")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--whole-responses", action="store_true",
                   help="rows end at their last response that fits whole (data.whole_responses)")  # fmt: skip
    p.add_argument("--sdpo-weight", type=float, default=1.0, help="alpha of the SDPO channel")
    p.add_argument("--sdpo-source", choices=("recorded", "on_policy"), default="on_policy",
                   help="SDPO source of the full recipe (sft+sdpo+dpo, +grpo)")  # fmt: skip
    p.add_argument("--on-policy-tokens", type=int, default=24, help="tokens sampled per site (on_policy)")
    p.add_argument("--on-policy-temperature", type=float, default=1.0)
    p.add_argument("--privileged", choices=("none", "recovery"), default="recovery",
                   help="what the on-policy teacher sees beyond the hint (loss.sdpo.on_policy.privileged)")  # fmt: skip
    p.add_argument("--dpo-weight", type=float, default=0.03,
                   help="beta of the preference channel (0.03: chosen on a validation slice, docs/training.md)")  # fmt: skip
    p.add_argument("--dpo-pairs", choices=("failure", "recovery", "both"), default="failure",
                   help="where the training recovery pairs sit (offline_data.recovery_pairs at=): before the "
                   "failed step, after its error result (the recovery's state, the failed step repeated "
                   "rejected), or both")  # fmt: skip
    p.add_argument("--rpo-alpha", type=float, default=RPO_ALPHA,
                   help="RPO's NLL weight in the preference channel (loss.preference.rpo_alpha; 0: plain DPO)")  # fmt: skip
    p.add_argument("--grpo-steps", type=int, default=2, help="GRPO steps of the +grpo variant (2 tasks each)")
    p.add_argument("--grpo-generations", type=int, default=2, help="completions per task in a GRPO group")
    p.add_argument("--grpo-temperature", type=float, default=1.0, help="GRPO sampling temperature")
    p.add_argument("--grpo-lr", type=float, default=1e-5, help="GRPO learning rate (all weights)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="greedy answer budget at a site (recorded recoveries: 64 tokens at the median, 21 of 30 "
        "within 256; a call cut short is invalid, so a small budget reads as malformed actions)",
    )
    p.add_argument("--eval-batch", type=int, default=32, help="sites per measuring batch (KV-cached decode)")
    p.add_argument("--sandbox-new-tokens", type=int, default=64, help="greedy tokens per sandbox task")
    p.add_argument("--sandbox-tasks", default="", help="comma-separated bundled tasks (default: all)")
    a = p.parse_args(argv)
    for flag in ("train_sessions", "eval_sessions"):
        d = Path(getattr(a, flag))
        if not d.is_dir():
            fail(f"--{flag.replace('_', '-')} {d}: no such session folder")
    a.variants = [v for v in a.variants.split(",") if v]
    a.metrics = [m for m in a.metrics.split(",") if m]
    for v in a.variants:
        if v not in VARIANTS:
            fail(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    for m in a.metrics:
        if m not in METRICS:
            fail(f"unknown metric {m!r}; choose from {', '.join(METRICS)}")
    # checked here, not when the GRPO phase starts after the full recipe's training (the config's own bounds)
    if a.grpo_generations < 2:
        fail(f"--grpo-generations {a.grpo_generations}: a GRPO group needs at least 2 completions")
    if a.grpo_temperature <= 0 or a.grpo_lr <= 0:
        fail(f"--grpo-temperature {a.grpo_temperature} / --grpo-lr {a.grpo_lr}: both must be above 0")
    if a.dtype == "bfloat16" and not bf16_native():
        print("bench_learning.py: warning: --dtype bfloat16 on a CPU without AVX512-BF16 or AMX: its bf16 "
              "matmuls are emulated, several times slower than float32 (docs/benchmarks/learning.md)",
              file=sys.stderr)  # fmt: skip
    if a.quick:
        a.seeds = 1
    if a.seeds < 1:
        fail(f"--seeds {a.seeds}: need at least one seed")
    return a


def bf16_native(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX flags in ``/proc/cpuinfo``);
    True where that cannot be read (no claim either way)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split()}
    return not flags or bool(flags & {"avx512_bf16", "amx_bf16"})


# ----------------------------------------------------------------------------- data


def ingest(folder: Path, work: Path) -> tuple[list[dict], dict[str, list[str]]]:
    """Traces of ``folder`` and each trace's tool names (from its states)."""
    from composer_replication.ingestion import ingest_paths
    from composer_replication.trainer.data import load_rows

    stats = ingest_paths([folder], work)
    if not stats["totals"]["n_states_emitted"]:
        fail(f"{folder}: no sessions with assistant turns in this folder")
    tools: dict[str, list[str]] = {}
    for st in load_rows(work / "states.jsonl"):
        tools.setdefault(str(st.get("trace_id")), list(st.get("tools") or []))
    return load_rows(work / "traces.jsonl"), tools


def train_config(a: argparse.Namespace, variant: dict, seed: int, data_dir: Path) -> dict:
    sdpo = {"weight": a.sdpo_weight if variant["sdpo"] else 0.0,
            "source": variant.get("source", a.sdpo_source),
            "on_policy": {"max_new_tokens": a.on_policy_tokens, "temperature": a.on_policy_temperature,
                          "sites_per_batch": a.batch_size, "privileged": a.privileged}}  # fmt: skip
    return {
        "mode": "offline", "seed": seed, "model": {"path": a.model, "dtype": a.dtype},
        "data": {"traces": str(data_dir / "traces.jsonl"), "pairs": str(data_dir / "pairs.jsonl"),
                 "max_seq_len": a.max_seq_len, "max_dpo_seq_len": a.max_seq_len,
                 "whole_responses": a.whole_responses},
        "loss": {"sdpo": sdpo, "preference": {"weight": a.dpo_weight if variant["dpo"] else 0.0,
                                              "rpo_alpha": a.rpo_alpha}},
        "optimizer": {"lr": a.lr},
        "schedule": {"max_steps": a.steps, "batch_size": a.batch_size, "type": "cosine",
                     "warmup_steps": max(1, a.steps // 8)},
        "lora": {"enabled": True, "r": a.lora_r, "alpha": 2 * a.lora_r, "target_modules": a.lora_targets},
        "logging": {"progress": False, "plot": False},
    }  # fmt: skip


# ----------------------------------------------------------------------------- measuring


def sandbox_metrics(model: Any, tok: Any, tasks: list[str], max_new_tokens: int) -> dict[str, float]:
    """One greedy completion per bundled task, from the prompt GRPO and the rollouts use
    (``datagen.rollout.task_prompt``), scored by GRPO's reward (``datagen.reward.make_shaped_reward``:
    0.1 well-formed + 0.2 calls that ran + 0.7 share of tests passing); the pass rate counts completions
    after which every test passes. Infrastructure failures are left out, never scored 0."""
    import torch

    from composer_replication import encoding
    from composer_replication.datagen.reward import make_shaped_reward
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tasks import bundled_tasks
    from composer_replication.generation.engine import decode, eos_token_ids, prefill

    all_tasks = bundled_tasks()
    names = tasks or sorted(all_tasks)
    prompts = [encoding.render_prompt_ids(tok, task_prompt(all_tasks[n])) for n in names]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            pre = prefill(model, prompts, encoding.pad_id(tok))
            ids = decode(model, pre, max_new_tokens=max_new_tokens, temperature=0, eos_ids=eos_token_ids(tok))
    finally:
        model.train(was_training)
    reward = make_shaped_reward({n: all_tasks[n] for n in names})
    scores = reward([tok.decode(x, skip_special_tokens=True) for x in ids], names)
    parts = [p for p in reward.last_parts if p is not None]  # type: ignore[attr-defined]  # set by each call
    rewards = [r for r in scores if r is not None]
    if not rewards:
        return {}
    return {
        "sandbox_reward": sum(rewards) / len(rewards),
        "sandbox_pass_rate": sum(p["tests"] >= 1.0 for p in parts) / len(parts),
    }


def _n_shared(model: Any, a: argparse.Namespace) -> int:
    """Adapters on the last ``lora_layers`` blocks leave the first ones the base model's: their work on
    the same inputs is done once and replayed for every model sharing them (``trainer.evaluation.frozen_prefix``;
    bit-identical numbers)."""
    n = int(model.config.num_hidden_layers)
    return n - a.lora_layers if 0 < a.lora_layers < n else 0


def _shared_layers(model: Any, a: argparse.Namespace, *, weights_fixed: bool = False) -> Any:
    """``model`` bound to the runs' :class:`FrozenPrefix` (a no-op when no layer is shared): training
    batches, sampling prefills and the sandbox prompts repeat across runs and steps."""
    import contextlib

    from composer_replication.trainer.evaluation.frozen_prefix import FrozenPrefix

    n = _n_shared(model, a)
    if n == 0:
        return contextlib.nullcontext()
    if n not in _TRAIN_PREFIX:
        _TRAIN_PREFIX.clear()
        _TRAIN_PREFIX[n] = FrozenPrefix(n)
    return _TRAIN_PREFIX[n].bind(model, weights_fixed=weights_fixed)


def progress_bar(label: str, phase: str, total: int | None, unit: str) -> Any:
    """A tqdm bar on stderr for one phase of one variant (stdout keeps the results)."""
    from tqdm import tqdm

    return tqdm(
        total=total, desc=f"{label}: {phase}", unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True
    )


def measure(model, tok, sites, a, label: str = "") -> dict[str, Any]:
    greedy = bool({"valid_rate", "tool_match_rate"} & set(a.metrics))
    with progress_bar(label, f"measure {len(sites)} sites", sites.stages(greedy), "stage") as bar:

        def done(stage: str) -> None:
            bar.set_postfix_str(stage, refresh=False)
            bar.update(1)

        out = sites.measure(model, greedy=greedy, shared_layers=_n_shared(model, a), progress=done)
    if {"sandbox_reward", "sandbox_pass_rate"} & set(a.metrics):
        tasks = [t for t in a.sandbox_tasks.split(",") if t]
        with progress_bar(label, f"sandbox {len(tasks) or 'all'} tasks", None, "task") as bar:
            with _shared_layers(model, a, weights_fixed=True):  # the task prompts' prefill
                out.update(sandbox_metrics(model, tok, tasks, a.sandbox_new_tokens))
            bar.update(len(tasks))
    return out


def grpo_phase(model: Any, tok: Any, a: argparse.Namespace, seed: int, work: Path) -> tuple[Any, float, dict]:
    """GRPO on the bundled sandbox tasks after the offline phase (the pipeline's online phase): the model
    after it, how far GRPO moved the weights (L2 norm of the change / L2 norm of the weights; exactly 0
    when every group had zero reward variance, so the policy term had no gradient) and the phase's
    summary (rewards, share of zero-variance groups)."""
    import torch
    from transformers import AutoModelForCausalLM

    from composer_replication.config import build_config
    from composer_replication.pipeline.grpo_phase import train_grpo_on_tasks

    merged = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    start = work / f"grpo-start-{seed}"
    merged.save_pretrained(start)
    tok.save_pretrained(start)
    cfg = build_config({
        "mode": "grpo", "seed": seed, "model": {"path": str(start)}, "data": {"traces": str(work / "traces.jsonl")},
        "optimizer": {"lr": a.grpo_lr}, "schedule": {"max_steps": a.grpo_steps, "batch_size": 2},
        "checkpoint": {"every_steps": 0}, "logging": {"progress": True, "plot": False},  # TRL's bar, on stderr
        "grpo": {"num_generations": a.grpo_generations, "max_completion_length": 48,
                 "temperature": a.grpo_temperature},
    })  # fmt: skip
    tasks = [t for t in a.sandbox_tasks.split(",") if t]
    summary = train_grpo_on_tasks(cfg, out_dir=work / f"grpo-{seed}", tasks=tasks, resume=False)  # fp32 (CPU)
    after = AutoModelForCausalLM.from_pretrained(
        work / f"grpo-{seed}" / "final", dtype=getattr(torch, a.dtype)
    )
    moved, norm = 0.0, 0.0
    with torch.no_grad():
        new = after.state_dict()
        for name, w in merged.state_dict().items():
            moved += float((new[name].double() - w.double()).pow(2).sum())
            norm += float(w.double().pow(2).sum())
    return after, (moved / norm) ** 0.5 if norm else 0.0, summary


# ----------------------------------------------------------------------------- runs


# What measuring depends on: the base model's run is keyed by these alone (training flags do not move it).
EVAL_SETTINGS = (
    "model",
    "dtype",
    "max_seq_len",
    "max_new_tokens",
    "eval_batch",
    "sandbox_new_tokens",
    "sandbox_tasks",
)


# Settings only a channel reads: a variant without that channel is keyed without them, so that SFT (say)
# trained for one SDPO weight answers for every other from the run cache.
CHANNEL_SETTINGS = {
    "sdpo": ("sdpo_weight", "sdpo_source", "on_policy_tokens", "on_policy_temperature", "privileged"),
    "on_policy": ("sdpo_source", "on_policy_tokens", "on_policy_temperature", "privileged"),
    "dpo": ("dpo_weight", "dpo_pairs", "rpo_alpha"),
    "grpo": ("grpo_steps", "grpo_generations", "grpo_temperature", "grpo_lr"),
}


def run_key(a: argparse.Namespace, name: str, seed: int, data_hash: str) -> str:
    variant = VARIANTS[name]
    settings = {k: v for k, v in vars(a).items() if k not in ("out", "seeds", "quick", "variants", "metrics")}
    if variant is None:
        settings = {k: settings[k] for k in EVAL_SETTINGS}
    else:
        unused = [c for c in ("sdpo", "dpo", "grpo") if not variant.get(c)]
        if variant.get("source") == "recorded":
            unused.append("on_policy")
        for k in (k for c in unused for k in CHANNEL_SETTINGS[c]):
            settings.pop(k, None)
    blob = json.dumps([name, variant, seed if variant else None, data_hash, settings, sorted(a.metrics)],
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def one_run(name, seed, a, base, tok, sites, train_traces, train_pairs, work) -> dict[str, Any]:
    import torch

    from composer_replication.config import build_config
    from composer_replication.trainer.offline.stepper import OfflineStepper
    from composer_replication.trainer.prepare import apply_lora, seed_everything

    variant = VARIANTS[name]
    t0 = time.time()
    label = f"{name} seed {seed}"
    if variant is None:
        metrics = _clean(measure(base, tok, sites, a, label))
        return {"metrics": metrics, "seconds": time.time() - t0, "channels": {}}
    key = json.dumps([{k: v for k, v in variant.items() if k != "grpo"}, seed], sort_keys=True)
    if key in _TRAINED:  # the GRPO variant continues the full recipe's adapter of the same seed
        model, info = _TRAINED[key]
    else:
        cfg = build_config(train_config(a, variant, seed, work))
        seed_everything(seed, True)
        model = apply_lora(copy.deepcopy(base), cfg)
        model.train()
        stepper = OfflineStepper(
            cfg, model, tok, torch.device("cpu"), train_traces=train_traces, train_pairs=train_pairs
        )
        steps = cfg.schedule.max_steps
        # the base model's first layers: their work done once per input
        with _shared_layers(model, a), progress_bar(label, "train", steps, "step") as bar:
            log = []
            for _ in range(steps):
                log.append(stepper.step())
                bar.set_postfix(loss=f"{log[-1]['loss/total']:.4f}", refresh=False)
                bar.update(1)
        info = {
            "channels": {
                k: statistics.fmean(r.get(k, 0.0) for r in log) for k in log[0] if k.startswith("loss/")
            },
            "first_loss": log[0]["loss/total"],
            "last_loss": log[-1]["loss/total"],
            "train_seconds": time.time() - t0,
        }
        _TRAINED.clear()
        _TRAINED[key] = (model, info)
    extra: dict[str, Any] = {}
    if variant.get("grpo"):
        model, change, extra["grpo"] = grpo_phase(model, tok, a, seed, work)
        extra["grpo_weight_change"] = change
        if change == 0.0 and key in _MEASURED:  # the very same weights: measuring again gives the same
            extra["measured"] = "reused: GRPO left every weight unchanged"
            return {
                "metrics": _MEASURED[key],
                "seconds": time.time() - t0,
                "eval_seconds": 0.0,
                **info,
                **extra,
            }
    t1 = time.time()
    metrics = _clean(measure(model, tok, sites, a, label))
    if not variant.get("grpo"):
        _MEASURED.clear()
        _MEASURED[key] = metrics
    return {
        "metrics": metrics,
        "seconds": time.time() - t0,
        "eval_seconds": time.time() - t1,
        **info,
        **extra,
    }


_TRAINED: dict[str, tuple[Any, dict]] = {}  # the last trained adapter (the GRPO variant starts from it)
_TRAIN_PREFIX: dict[int, Any] = {}  # the shared first layers' work: training runs, sandbox prompts
_MEASURED: dict[str, dict] = {}  # its metrics (a GRPO phase that moved nothing is not measured again)


def lora_targets(model: Any, last: int) -> str:
    """PEFT ``target_modules``: every linear layer, or (``last > 0``) those of the last ``last`` blocks."""
    n = int(model.config.num_hidden_layers)
    if last <= 0 or last >= n:
        return "all-linear"
    ids = "|".join(str(i) for i in range(n - last, n))
    return rf".*\.layers\.({ids})\.(self_attn|mlp)\.\w+_proj"


def _clean(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "answers"} | {
        "answers": m.get("answers", [])[:40]
    }  # per_site kept


def summarise(runs: dict[str, list[dict]], metrics: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, rs in runs.items():
        out[name] = {}
        for m in metrics:
            vals = [r["metrics"][m] for r in rs if r["metrics"].get(m) is not None]
            if vals:
                std = statistics.stdev(vals) if len(vals) > 1 else 0.0
                out[name][m] = {"mean": statistics.fmean(vals), "std": std, "n": len(vals)}
    return out


def paired_vs(runs: dict[str, list[dict]], ref: str = "sft") -> dict[str, dict]:
    """Per variant, the per-site change against ``ref`` (each site's value averaged over seeds first):
    mean, spread and 95% interval over sites (``trainer.evaluation.paired.paired``)."""
    from composer_replication.trainer.evaluation.paired import paired

    def site_means(rs: list[dict], m: str) -> list[float]:
        cols = [r["metrics"].get("per_site", {}).get(m) or [] for r in rs]
        n = min(len(c) for c in cols)
        return [statistics.fmean(c[i] for c in cols) for i in range(n)]

    if ref not in runs:
        return {}
    out: dict[str, dict] = {}
    for name, rs in runs.items():
        if name == ref:
            continue
        out[name] = {}
        for m in ("recovery_ce", "hinted_jsd", "valid_rate", "tool_match_rate"):
            a, b = site_means(runs[ref], m), site_means(rs, m)
            if a and len(a) == len(b):
                out[name][m] = {k: v for k, v in paired(a, b).items() if k != "delta_std"}
    return out


def markdown_table(summary: dict[str, dict], metrics: list[str]) -> str:
    """``mean ± std (n)`` per variant and metric, as a Markdown table."""
    lines = ["| variant | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, per in summary.items():
        cells = [
            f"{per[m]['mean']:.4g} ± {per[m]['std']:.2g} ({per[m]['n']})" if m in per else "—"
            for m in metrics
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from composer_replication._io import JsonlAppender, atomic_write_json, read_jsonl
    from composer_replication.trainer.data import recovery_pairs
    from composer_replication.trainer.error_sites import error_sites
    from composer_replication.trainer.evaluation.sites import SiteSet
    from composer_replication.trainer.prepare import load_model

    t_start = time.time()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / (out.stem + ".work")
    train_traces, _ = ingest(Path(a.train_sessions), work / "train")
    eval_traces, eval_tools = ingest(Path(a.eval_sessions), work / "eval")
    shared = {t["trace_id"] for t in train_traces} & {t["trace_id"] for t in eval_traces}
    if shared:
        fail(f"sessions on both sides: {sorted(shared)[:3]}; keep each session in one folder")
    sides: tuple[Literal["failure", "recovery"], ...] = (
        ("failure", "recovery") if a.dpo_pairs == "both" else (a.dpo_pairs,)
    )
    train_pairs = [p for at in sides for p in recovery_pairs(train_traces, at=at)]
    (work / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train_traces))
    (work / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in train_pairs))
    data_hash = hashlib.sha256(
        (work / "traces.jsonl").read_bytes() + json.dumps(eval_traces).encode()
    ).hexdigest()

    from composer_replication.config import build_config

    base, tok = load_model(
        build_config(
            {"model": {"path": a.model, "dtype": a.dtype}, "data": {"traces": str(work / "traces.jsonl")}}
        ),
        torch.device("cpu"),
    )
    a.lora_targets = lora_targets(base, a.lora_layers)
    eval_sites = error_sites(eval_traces, need_hint=False)
    sites = SiteSet(tok, eval_sites, pairs=recovery_pairs(eval_traces), max_len=a.max_seq_len,
                    max_new_tokens=a.max_new_tokens, tools_by_trace=eval_tools, batch_size=a.eval_batch)  # fmt: skip
    cache_path = out.with_suffix(".runs.jsonl")
    cache = {r["key"]: r for r in read_jsonl(cache_path)} if cache_path.exists() else {}
    runs: dict[str, list[dict]] = {}
    # seed-major, so that the GRPO variant continues the same seed's full recipe without retraining it
    order = [(n, s) for s in range(a.seeds) for n in a.variants if VARIANTS[n] or s == 0]
    with JsonlAppender(cache_path) as log:
        for name, seed in order:
            key = run_key(a, name, seed, data_hash)
            if key not in cache:
                res = one_run(name, seed, a, base, tok, sites, train_traces, train_pairs, work)
                cache[key] = {"key": key, "variant": name, "seed": seed, **res}
                log.write(cache[key])
                shown = {m: cache[key]["metrics"].get(m) for m in a.metrics}
                print(f"{name} seed {seed}: {json.dumps(shown)} ({res['seconds']:.0f}s)", flush=True)
            runs.setdefault(name, []).append(cache[key])
    runs = {n: runs[n] for n in a.variants if n in runs}
    config = {k: v for k, v in vars(a).items() if k not in ("out",)}
    config.update(
        n_sites=len(sites), n_hinted_sites=sum(r.hinted is not None for r in sites.rows),
        n_eval_pairs=len(sites.pair_rows), n_train_traces=len(train_traces), n_train_pairs=len(train_pairs),
        n_train_sites=len(error_sites(train_traces)), runs_file=str(cache_path),
        seconds=round(time.time() - t_start, 1), channels={n: rs[0].get("channels", {}) for n, rs in runs.items()},
        grpo_builder="pipeline.grpo_phase.train_grpo_on_tasks (datagen.reward.make_shaped_reward)",
        paired_vs_sft=paired_vs(runs),
        diagnostics=summarise(runs, list(DIAGNOSTICS)),
    )  # fmt: skip
    summary = summarise(runs, a.metrics)
    atomic_write_json(out, {"variants": summary, "config": config})
    print(markdown_table(summary, a.metrics))
    print(markdown_table(config["diagnostics"], list(DIAGNOSTICS)))
    for name, per in config["paired_vs_sft"].items():
        shown = {
            m: f"{d['delta']:+.4g} [{d['delta_ci95'][0]:+.3g}, {d['delta_ci95'][1]:+.3g}]"
            for m, d in per.items()
        }
        print(f"{name} - sft (per site, n={next(iter(per.values()))['n'] if per else 0}): {shown}")
    print(f"wrote {out} in {time.time() - t_start:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
