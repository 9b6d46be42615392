"""On-policy SDPO and site evaluation decode through the one engine and give the old loop's tokens.

The reference is the pre-engine ``trainer.offline.onpolicy`` loop, kept verbatim in
``benchmarks/bench_generate.py``. A tiny seeded model with a livelier init (at the default init it
repeats the prompt's last token), real error sites of the bundled sessions.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from composer_replication.generation import engine
from composer_replication.trainer import error_sites as es
from composer_replication.trainer.offline import onpolicy as op

from .conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_generate", ROOT / "benchmarks" / "bench_generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def traces(ingested):
    from composer_replication.ingestion import read_examples

    return list(read_examples(ingested / "traces.jsonl"))


@pytest.fixture()
def lively(tiny_tokenizer):
    from composer_replication.models import build_tiny_model

    return build_tiny_model(tokenizer=tiny_tokenizer, seed=3, initializer_range=0.2)


def test_on_policy_samples_are_the_old_loops_draws(
    bench, small_data, traces, lively, tiny_tokenizer, one_thread
):
    from composer_replication.config import build_config

    sections = {"loss": {"sdpo": {"weight": 1.0, "source": "on_policy", "on_policy": {"max_new_tokens": 12,
                "sites_per_batch": 4}}, "preference": {"weight": 0.0}}}  # fmt: skip
    cfg = build_config(tiny_config(small_data, **sections))
    policy = op.OnPolicySDPO(tiny_tokenizer, es.error_sites(traces), cfg, seed=7)
    state = policy.stream.state_dict()
    batch, _ = policy.batch(lively, step=2, micro=1)
    assert batch is not None
    policy.stream.load_state_dict(state)  # the same sites again, for the old loop
    sites = policy.stream.next_batch()
    prompts = [es.site_prompts(tiny_tokenizer, s, policy.max_prompt)[0] for s in sites]
    want = bench.old_onpolicy_sample(
        lively, prompts, max_new_tokens=12, temperature=policy.temperature, eos_ids=policy.eos,
        pad_id=policy.pad, generator=torch.Generator().manual_seed(op._mix(7, 2, 1)),
    )  # fmt: skip
    got = [policy.cache.samples[f"7:2:1:{s.site_id}"] for s in sites]
    assert got == want and len({tuple(x) for x in got}) == len(got) > 1


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0])
def test_engine_sample_is_the_old_loop_with_rows_ending_early(bench, lively, temperature, one_thread):
    prompts = [[5, 17, 23, 99, 4], [7, 8], [31, 32, 33], [40, 41, 42, 43], list(range(60, 90))]
    free = engine.sample(lively, prompts, max_new_tokens=16, temperature=0, eos_ids=[], pad_id=0)
    eos = sorted({free[0][3], free[2][9]})  # rows end at different steps
    kw = dict(max_new_tokens=16, temperature=temperature, eos_ids=eos, pad_id=0)
    got = engine.sample(lively, prompts, generator=torch.Generator().manual_seed(11), **kw)
    want = bench.old_onpolicy_sample(lively, prompts, generator=torch.Generator().manual_seed(11), **kw)
    assert got == want
    if temperature == 0:
        assert len({len(g) for g in got}) > 1  # finished rows left the batch on the way


def test_site_evaluation_answers_are_the_old_loops(bench, traces, lively, tiny_tokenizer, one_thread):
    from composer_replication.generation.engine import eos_token_ids
    from composer_replication.trainer.evaluation.sites import SiteSet

    ss = SiteSet(tiny_tokenizer, es.error_sites(traces)[:6], max_len=200, max_new_tokens=10, batch_size=4)
    got = ss.greedy_answers(lively)
    want = []
    for i in range(0, len(ss.rows), 4):
        pre = bench.old_prefill(lively, [r.prompt for r in ss.rows[i : i + 4]], ss.pad)
        ids = bench.old_decode(
            lively, pre, max_new_tokens=10, temperature=0, eos_ids=eos_token_ids(tiny_tokenizer)
        )
        want += [tiny_tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    assert got == want and len(set(got)) > 1
