"""The prompt-lookup decoding prototype of benchmarks/bench_lookup_decode.py (measured and not kept:
docs/benchmarks/learning.md) decodes the greedy answers ``onpolicy.decode`` gives, rows ending early and
the KV buffer compacted on the way, so the timing it reports compares like with like."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from composer_replication.generation import engine

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_lookup_decode", ROOT / "benchmarks" / "bench_lookup_decode.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lookup_drafts_continue_the_latest_occurrence_periodically():
    look = _bench().Lookup([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2])
    assert look.draft(3) == [3, 4, 5]  # the latest "1 2" was followed by 3 4 5
    loop = _bench().Lookup([7, 8, 7, 8, 7])
    assert loop.draft(5) == [8, 7, 8, 7, 8]  # a loop runs on past the end of the context
    assert _bench().Lookup([1, 2, 3]).draft(4) == []  # nothing seen twice: no draft


def test_lookup_decode_gives_the_plain_greedy_answers(tiny_model, monkeypatch):
    bench = _bench()
    compact, compacted = bench._compact, []
    monkeypatch.setattr(bench, "_compact", lambda *a: compacted.append(1) or compact(*a))
    tiny_model.eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (9, 4, 13, 6, 11)]
    prompts[1] = prompts[1] * 3  # repeated text to look drafts up in
    free = engine.sample(tiny_model, prompts, max_new_tokens=40, temperature=0, eos_ids=[], pad_id=0)
    for eos in ([], sorted({free[0][5], free[3][17]})):
        want = engine.sample(tiny_model, prompts, max_new_tokens=40, temperature=0, eos_ids=eos, pad_id=0)
        for draft in (1, 3, 8):
            log: list = []
            pre = engine.prefill(tiny_model, prompts, 0)
            got = bench.lookup_decode(
                tiny_model, pre, prompts, max_new_tokens=40, eos_ids=eos, draft=draft, log=log
            )
            assert got == want, (eos, draft)
            assert len(log) < 40  # drafts were kept: fewer forwards than tokens
    assert len({len(x) for x in want}) > 1  # rows did end early at an EOS
    # drafts that are mostly wrong: rejected slots stay masked, fill the buffer and get compacted away
    monkeypatch.setattr(bench.Lookup, "draft", lambda self, k: [(self.ctx[-1] + 1) % 200] * k)
    pre = engine.prefill(tiny_model, prompts, 0)
    got = bench.lookup_decode(tiny_model, pre, prompts, max_new_tokens=40, eos_ids=eos, draft=6, log=[])
    assert got == want and compacted
