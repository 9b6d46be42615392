"""Prompt-lookup (speculative) greedy decoding against the plain batched decode: same answers? faster?

A prototype measured and *not* kept (docs/benchmarks/learning.md, "Prompt-lookup greedy decoding"): per
row, the last 1-3 tokens are looked up in that row's own context (prompt and answer so far), the tokens
that followed their latest earlier occurrence are proposed (continued periodically past the end: a loop),
and one forward of ``[pending token, draft...]`` for every live row keeps the draft's longest prefix that
equals the row's greedy choices, plus the next choice. Rows accept different lengths, so rejected slots
stay masked in the shared KV buffer (``generation.kv_buffer``), compacted to each row's valid slots when full.

    python3 benchmarks/bench_lookup_decode.py --drafts 4,8 [--log]

Prompts: the learning benchmark's held-out error sites (the base model's greedy answers of
``bench_learning.py``'s measuring); answers compared token for token with ``generation.engine.decode``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
NGRAM = 3  # the longest suffix looked up (then shorter ones)


class Lookup:
    """One row's context and, per n-gram of up to NGRAM tokens, the index of the token that followed
    its latest earlier occurrence."""

    def __init__(self, context: Sequence[int]) -> None:
        self.ctx: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            j = len(self.ctx)
            for n in range(1, NGRAM + 1):
                if j >= n:
                    self.after[tuple(self.ctx[j - n : j])] = j
            self.ctx.append(int(t))

    def draft(self, k: int) -> list[int]:
        ctx = self.ctx
        for n in range(min(NGRAM, len(ctx)), 0, -1):
            p = self.after.get(tuple(ctx[-n:]))
            if p is None:
                continue
            out: list[int] = []
            for j in range(k):
                i = p + j
                out.append(ctx[i] if i < len(ctx) else out[i - len(ctx)])
            return out
        return []


def _compact(cache: Any, attn: torch.Tensor, room: int) -> torch.Tensor:
    from composer_replication.generation.kv_buffer import BufferedLayer

    keep = attn.bool()
    width = int(keep.sum(-1).max())
    order = torch.sort(keep.to(torch.int8), dim=-1, stable=True).indices[:, -width:]
    for i, layer in enumerate(cache.layers):
        idx = order[:, None, :, None]
        k = layer.keys.gather(2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1]))
        v = layer.values.gather(2, idx.expand(-1, layer.values.shape[1], -1, layer.values.shape[-1]))
        cache.layers[i] = BufferedLayer(k, v, room)
    return attn.gather(1, order)


@torch.no_grad()
def lookup_decode(
    model, pre, contexts, *, max_new_tokens: int, eos_ids, draft: int, log: list
) -> list[list[int]]:
    from composer_replication.generation.kv_buffer import buffer_cache

    eos = {int(e) for e in eos_ids}
    room = max_new_tokens + 2 * (draft + 1)
    cache, attn, pos = buffer_cache(pre.cache, room), pre.attn, pre.pos
    nxt = pre.logits.argmax(-1).tolist()  # each live row's pending token: chosen, not yet in the cache
    look = [Lookup(c) for c in contexts]
    seqs: list[list[int]] = [[] for _ in contexts]
    live = list(range(len(contexts)))

    def select(rows: list[int]) -> None:
        nonlocal attn, pos, live, nxt
        idx = torch.tensor(rows)
        attn, pos = attn[idx], pos[idx]
        cache.batch_select_indices(idx)
        live, nxt = [live[b] for b in rows], [nxt[b] for b in rows]

    while True:
        rows = []
        for b, i in enumerate(live):  # the pending token joins the answer
            seqs[i].append(nxt[b])
            look[i].extend([nxt[b]])
            if nxt[b] not in eos and len(seqs[i]) < max_new_tokens:
                rows.append(b)
        if not rows:
            return seqs
        if len(rows) < len(live):
            select(rows)
        drafts = [look[i].draft(min(draft, max_new_tokens - len(seqs[i]))) for i in live]
        width = 1 + max(len(d) for d in drafts)
        if cache.layers[0].n + width > cache.layers[0]._k.shape[-2]:
            attn = _compact(cache, attn, room)
        block = torch.zeros((len(live), width), dtype=torch.long)
        mask = torch.zeros((len(live), width), dtype=attn.dtype)
        for b, d in enumerate(drafts):
            block[b, : 1 + len(d)] = torch.tensor([nxt[b], *d])
            mask[b, : 1 + len(d)] = 1
        t0 = time.perf_counter()
        out = model(input_ids=block, attention_mask=torch.cat([attn, mask], -1),
                    position_ids=pos + torch.arange(1, width + 1)[None], cache=cache, use_cache=True)  # fmt: skip
        choice = out.logits.argmax(-1).tolist()  # the greedy token after each input position
        taken = []
        for b, i in enumerate(live):
            d, c = drafts[b], choice[b]
            a = 0
            while a < len(d) and d[a] == c[a] and d[a] not in eos:
                a += 1
            if a < len(d) and d[a] == c[a]:  # an EOS the model chose too: kept, the row ends there
                a += 1
            seqs[i].extend(d[:a])
            look[i].extend(d[:a])
            nxt[b] = c[a]
            taken.append(a)
        log.append((len(live), width, time.perf_counter() - t0, sum(taken) + len(taken)))
        t = torch.tensor(taken)
        attn = torch.cat([attn, (torch.arange(width)[None] <= t[:, None]).to(attn.dtype)], -1)
        pos = pos + 1 + t[:, None]
        rest = [b for b, i in enumerate(live) if seqs[i][-1] not in eos and len(seqs[i]) < max_new_tokens]
        if not rest:
            return seqs
        if len(rest) < len(live):
            select(rest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafts", default="4,8", help="comma-separated most draft tokens per forward")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument(
        "--eval-sessions", default=str(ROOT / "src/composer_replication/data/learning_sessions/eval")
    )
    p.add_argument(
        "--log", action="store_true", help="print every lookup forward: rows, width, ms, tokens kept"
    )
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_learning as bl

    from composer_replication.config import build_config
    from composer_replication.generation import engine
    from composer_replication.trainer.error_sites import error_sites
    from composer_replication.trainer.evaluation.sites import SiteSet
    from composer_replication.trainer.prepare import load_model

    with tempfile.TemporaryDirectory() as tmp:
        traces, tools = bl.ingest(Path(a.eval_sessions), Path(tmp) / "eval")
        cfg = build_config(
            {"model": {"path": "default"}, "data": {"traces": str(Path(tmp) / "eval/traces.jsonl")}}
        )
        model, tok = load_model(cfg, torch.device("cpu"))
    model.eval()
    sites = SiteSet(tok, error_sites(traces, need_hint=False), max_len=256,
                              max_new_tokens=a.max_new_tokens, tools_by_trace=tools, batch_size=32)  # fmt: skip
    prompts, eos, pad = [r.prompt for r in sites.rows], engine.eos_token_ids(tok), sites.pad
    pre = engine.prefill(model, prompts, pad)
    t = time.perf_counter()
    ref = engine.decode(model, pre, max_new_tokens=a.max_new_tokens, temperature=0, eos_ids=eos)
    print(f"plain decode: {time.perf_counter() - t:.1f} s, {len(prompts)} rows, {sum(map(len, ref))} tokens")
    for k in (int(x) for x in a.drafts.split(",") if x):
        log: list = []
        pre = engine.prefill(model, prompts, pad)
        t = time.perf_counter()
        got = lookup_decode(
            model, pre, prompts, max_new_tokens=a.max_new_tokens, eos_ids=eos, draft=k, log=log
        )
        same = sum(g == r for g, r in zip(got, ref, strict=True))
        print(f"drafts of up to {k}: {time.perf_counter() - t:.1f} s, {len(log)} forwards, "
              f"the same answer at {same} of {len(ref)} rows")  # fmt: skip
        for rows, width, sec, kept in log if a.log else []:
            print(f"  {rows:3d} rows x {width:2d}: {1000 * sec:6.0f} ms, {kept} tokens kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
