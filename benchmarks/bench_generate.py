"""Decoding throughput of the one generation engine against the code it replaced, side by side.

Four callers decoded on their own before ``composer_replication.generation``; each now decodes through
it. This script runs each caller's old decoding (kept below, verbatim: the reference the tests in
``tests/generation/test_same_tokens.py`` compare against) and its new one on the same prompts, in the
same process, interleaved (old then new, then new then old, ...), checks that both give the same tokens
and reports tokens per second and the new/old time ratio. The prompts are the bundled sandbox tasks'
opening messages (``datagen.rollout.task_prompt``: system message with the tools, the task), 540-780
tokens with the tiny tokenizer.

- ``onpolicy``: the prompts in one batch, sampled at temperature 1 from a seeded ``torch.Generator``
  (on-policy SDPO's draw): old = ``trainer.offline.onpolicy.sample`` before the engine, new = the engine's.
- ``evaluate``: greedy, one prompt at a time: old = ``model.generate`` as ``trainer.evaluation.greedy.GreedyGenerator``
  called it, new = ``GreedyGenerator`` (``LocalEngine``).
- ``rollout``: sampled at 0.7, one prompt at a time, global RNG seeded per prompt: old = ``model.generate``
  as ``datagen.rollout.HFPolicy`` called it, new = ``HFPolicy``'s engine.
- ``teacher``: greedy, one prompt at a time: old = ``model.generate`` as the in-process teacher called
  it, new = ``TransformersBackend``.
- ``batched`` (information): ``LocalEngine`` greedy over all prompts in one batch against the
  ``evaluate`` old path (one ``generate`` per prompt): what batching gives callers that can batch.
  Rows padded into a batch may differ from a run alone in float rounding; the count of equal rows is
  reported, not required.

    python3 benchmarks/bench_generate.py --model tiny --max-new-tokens 64 --repeats 3
    python3 benchmarks/bench_generate.py --model smollm2 --max-new-tokens 48 --repeats 2 --prompts 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# ----------------------------------------------------------------------------- the old code, verbatim


@torch.no_grad()
def old_prefill(model: Any, prompts: Sequence[Sequence[int]], pad_id: int) -> Any:
    from composer_replication import encoding
    from composer_replication.generation.engine import Prefill

    dev = next(model.parameters()).device
    ids = encoding.pad_rows(prompts, pad_id, left=True).to(dev)
    attn = encoding.pad_rows([[1] * len(p) for p in prompts], 0, left=True).to(dev)
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    return Prefill(out.logits[:, -1].float(), out.cache, attn, pos[:, -1:])


@torch.no_grad()
def old_decode(model, pre, *, max_new_tokens, temperature, eos_ids, generator=None) -> list[list[int]]:
    """``trainer.offline.onpolicy.decode`` before the engine."""
    dev = pre.attn.device
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=dev)
    n = pre.logits.shape[0]
    from composer_replication.generation.kv_buffer import buffer_cache

    logits, cache, attn, pos = pre.logits, buffer_cache(pre.cache, max_new_tokens), pre.attn, pre.pos
    live = torch.arange(n, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    seqs: list[list[int]] = [[] for _ in range(n)]
    for step in range(max_new_tokens):
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, -1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(-1).to(dev)
        for i, tok_id in zip(live.tolist(), nxt.tolist(), strict=True):
            if not done[i]:
                seqs[i].append(tok_id)
        done[live] |= torch.isin(nxt, eos)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if temperature == 0 and bool(done[live].any()):
            idx = (~done[live]).nonzero().squeeze(-1)
            live, nxt, attn, pos = live[idx], nxt[idx], attn[idx], pos[idx]
            cache.batch_select_indices(idx)
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], -1)
        pos = pos + 1
        out = model(
            input_ids=nxt[:, None], attention_mask=attn, position_ids=pos, cache=cache, use_cache=True
        )
        logits, cache = out.logits[:, -1].float(), out.cache
    return seqs


def old_onpolicy_sample(model, prompts, *, max_new_tokens, temperature, eos_ids, pad_id, generator=None):
    """``trainer.offline.onpolicy.sample`` before the engine."""
    if not prompts:
        return []
    was_training = model.training
    model.eval()
    try:
        pre = old_prefill(model, prompts, pad_id)
        return old_decode(model, pre, max_new_tokens=max_new_tokens, temperature=temperature, eos_ids=eos_ids,
                          generator=generator)  # fmt: skip
    finally:
        model.train(was_training)


def old_greedy_generator(model, tok, ids: torch.Tensor, max_new_tokens: int) -> tuple[str, bool, list[int]]:
    """``trainer.evaluation.greedy.GreedyGenerator.__call__``'s decoding before the engine: (text, complete, ids)."""
    from composer_replication.generation.engine import eos_token_ids

    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    eos = eos_token_ids(tok)
    complete = len(new) < max_new_tokens or (bool(new) and new[-1] in eos)
    return tok.decode(new, skip_special_tokens=True), complete, new


def old_hf_policy(
    model, tok, messages, *, max_new_tokens: int, temperature: float, tools=None
) -> tuple[str, list[int]]:
    """``datagen.rollout.HFPolicy.__call__`` before the engine: (text, ids). ``tools``: the prompt as the
    policy renders it now (``wire.render_ids`` with the tool schemas), so only the decoding is compared."""
    if tools is None:
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        from composer_replication import wire

        prompt = torch.tensor([wire.render_ids(tok, messages, tools)], dtype=torch.long)
        ids = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        out = model.generate(
            **ids,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature or None,
            pad_token_id=tok.pad_token_id,
        )
    new = out[0, ids["input_ids"].shape[1] :]
    return tok.decode(new, skip_special_tokens=True), new.tolist()


def old_teacher(model, tok, messages, *, max_tokens: int, temperature: float) -> tuple[str, int, int]:
    """``TransformersBackend._generate`` before the engine: (text, prompt tokens, completion tokens)."""
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    input_ids = enc["input_ids"]
    gen_kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": tok.pad_token_id}
    if temperature > 0:
        gen_kwargs.update(do_sample=True, temperature=temperature)
    else:
        gen_kwargs.update(do_sample=False)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=enc.get("attention_mask"), **gen_kwargs)
    new = out[0, input_ids.shape[1] :]
    return tok.decode(new, skip_special_tokens=True), int(input_ids.shape[1]), int(new.shape[0])


# ----------------------------------------------------------------------------- the workloads


def task_messages(n: int) -> list[list[dict[str, Any]]]:
    from composer_replication.datagen.rollout import task_prompt
    from composer_replication.datagen.tasks import bundled_tasks

    tasks = bundled_tasks()
    return [task_prompt(tasks[name]) for name in sorted(tasks)[:n]]


def workloads(
    model_dir: Path, model: Any, tok: Any, msgs: list, max_new: int
) -> dict[str, tuple[Callable, Callable]]:
    """name -> (old, new); each returns (comparable output, generated token count)."""
    from composer_replication import encoding
    from composer_replication.datagen.rollout import HFPolicy
    from composer_replication.generation.engine import eos_token_ids, sample
    from composer_replication.generation.local import LocalEngine, generate_params
    from composer_replication.teacher_replay.backends import transformers_local as tl
    from composer_replication.teacher_replay.backends.base import ChatRequest
    from composer_replication.trainer.evaluation.greedy import GreedyGenerator

    prompts = [encoding.render_prompt_ids(tok, m) for m in msgs]
    pad, eos = encoding.pad_id(tok), eos_token_ids(tok)
    states = [{"state_id": f"s{i}", "messages": m} for i, m in enumerate(msgs)]
    gg = GreedyGenerator(model_dir, Path(tempfile.mkdtemp()) / "gen.jsonl", max_new_tokens=max_new,
                         max_prompt_tokens=10**6)  # fmt: skip
    gg._tok, gg._engine = tok, LocalEngine(model, tok)
    hf = HFPolicy(model, tok, max_new_tokens=max_new, temperature=0.7)
    tl._MODELS[str(model_dir)] = (model, tok)
    teacher = tl.TransformersBackend({"slug": "local", "model_path": str(model_dir)})
    reqs = [ChatRequest(model="local", messages=m, max_tokens=max_new) for m in msgs]
    batch = LocalEngine(model, tok)

    def onpolicy(fn: Callable) -> Callable:
        def run():
            ids = fn(model, prompts, max_new_tokens=max_new, temperature=1.0, eos_ids=eos, pad_id=pad,
                     generator=torch.Generator().manual_seed(0))  # fmt: skip
            return ids, sum(map(len, ids))

        return run

    def each(fn: Callable) -> Callable:
        def run():
            got = [fn(i) for i in range(len(msgs))]
            counts = [g[1] for g in got]
            return [g[0] for g in got], None if None in counts else sum(counts)

        return run

    def old_eval(i):
        text, complete, new = old_greedy_generator(model, tok, torch.tensor([prompts[i]]), max_new)
        return (text, complete), len(new)

    def new_eval(i):
        return gg._answer(states[i]), None  # the same tokens as the old path (checked): its count

    def old_roll(i):
        torch.manual_seed(i)
        return old_hf_policy(model, tok, msgs[i], max_new_tokens=max_new, temperature=0.7, tools=hf.tools)[
            1
        ], None

    def new_roll(i):
        torch.manual_seed(i)
        params = generate_params(model, max_new_tokens=max_new, temperature=0.7)
        return hf.engine.complete([msgs[i]], params)[0].token_ids, None

    def count(run):
        def wrapped():
            out, n = run()
            return out, n if n is not None else sum(len(x) for x in out)

        return wrapped

    def old_teach(i):
        text, _, n = old_teacher(model, tok, msgs[i], max_tokens=max_new, temperature=0.0)
        return text, n

    def new_teach(i):
        r = teacher._generate(reqs[i])
        return r.text, r.completion_tokens

    def new_batched():
        got = batch.generate(prompts, generate_params(model, max_new_tokens=max_new, temperature=0.0))
        return [g.token_ids for g in got], sum(g.completion_tokens for g in got)

    def old_batched_ref():
        got = [old_greedy_generator(model, tok, torch.tensor([p]), max_new)[2] for p in prompts]
        return got, sum(map(len, got))

    return {
        "onpolicy": (onpolicy(old_onpolicy_sample), onpolicy(sample)),
        "evaluate": (each(old_eval), each(new_eval)),
        "rollout": (count(each(old_roll)), count(each(new_roll))),
        "teacher": (each(old_teach), each(new_teach)),
        "batched": (old_batched_ref, new_batched),
    }


def load(name: str) -> tuple[Path, Any, Any]:
    from composer_replication import models

    if name == "tiny":
        tok = models.build_tiny_tokenizer(2048)
        model = models.build_tiny_model(tokenizer=tok, seed=0)
        d = models.save_tiny_pair(Path(tempfile.mkdtemp()) / "tiny", model, tok)
        return d, model.eval(), tok
    model, tok = models.load_default_model()
    return models.resolve_default_model(), model.eval(), tok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=7, help="how many bundled tasks (at most 7)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", nargs="*", default=None, help="workload names (default: all)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model_dir, model, tok = load(a.model)
    runs = workloads(model_dir, model, tok, task_messages(a.prompts), a.max_new_tokens)
    names = a.only or list(runs)
    times: dict[str, dict[str, list[float]]] = {n: {"old": [], "new": []} for n in names}
    cpu: dict[str, dict[str, list[float]]] = {n: {"old": [], "new": []} for n in names}
    result: dict[str, Any] = {"model": a.model, "max_new_tokens": a.max_new_tokens, "prompts": a.prompts,
                              "threads": torch.get_num_threads(), "workloads": {}}  # fmt: skip
    for r in range(a.repeats):
        for n in names:
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            outs = {}
            for side in order:
                t0, c0 = time.perf_counter(), time.process_time()
                outs[side] = runs[n][0 if side == "old" else 1]()
                times[n][side].append(time.perf_counter() - t0)
                cpu[n][side].append(time.process_time() - c0)
            (old_out, n_old), (new_out, n_new) = outs["old"], outs["new"]
            n_new = n_old if n_new is None else n_new
            same = sum(x == y for x, y in zip(old_out, new_out, strict=True))
            w = result["workloads"].setdefault(
                n, {"tokens_old": n_old, "tokens_new": n_new, "rows": len(old_out)}
            )
            w["same_rows"] = min(w.get("same_rows", same), same)
            print(f"repeat {r} {n:9s} wall old {times[n]['old'][-1]:7.2f}s new {times[n]['new'][-1]:7.2f}s | "
                  f"cpu old {cpu[n]['old'][-1]:7.2f}s new {cpu[n]['new'][-1]:7.2f}s | same rows {same}/{len(old_out)}",
                  flush=True)  # fmt: skip
    for n in names:
        w = result["workloads"][n]
        old, new = min(times[n]["old"]), min(times[n]["new"])
        ratios = [b / o for o, b in zip(times[n]["old"], times[n]["new"], strict=True)]
        cpu_ratios = [b / o for o, b in zip(cpu[n]["old"], cpu[n]["new"], strict=True)]
        w |= {"old_s": times[n]["old"], "new_s": times[n]["new"], "old_cpu_s": cpu[n]["old"],
              "new_cpu_s": cpu[n]["new"], "old_tok_s": w["tokens_old"] / old, "new_tok_s": w["tokens_new"] / new,
              "wall_ratio_new_over_old": ratios, "cpu_ratio_new_over_old": cpu_ratios}  # fmt: skip
        print(f"{n:9s} old {w['old_tok_s']:8.1f} tok/s  new {w['new_tok_s']:8.1f} tok/s (best wall)  new/old wall "
              f"{min(ratios):.3f}-{max(ratios):.3f} cpu {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f} "
              f"(median {statistics.median(cpu_ratios):.3f})  "
              f"same rows {w['same_rows']}/{w['rows']}")  # fmt: skip
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
