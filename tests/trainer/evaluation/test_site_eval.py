"""Held-out site metrics against direct computations on the tiny model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from composer_replication.trainer.data import recovery_pairs
from composer_replication.trainer.error_sites import error_sites, site_messages
from composer_replication.trainer.evaluation.sites import SiteSet, recovery_ids


@pytest.fixture(scope="module")
def traces(ingested):
    from composer_replication.ingestion import read_examples  # the ingest folder's reader

    return list(read_examples(ingested / "traces.jsonl"))


def test_recovery_ce_is_the_token_nll_of_the_recorded_recovery_per_site(traces, tiny_model, tiny_tokenizer):
    sites = error_sites(traces)[:3]
    ss = SiteSet(tiny_tokenizer, sites, max_len=200, max_recovery=16)
    got = ss.measure(tiny_model, greedy=False)
    per_site, n = [], 0
    for s in sites:  # one unpadded forward per site, written out
        msgs = site_messages(s, hinted=False)
        rec = recovery_ids(tiny_tokenizer, msgs, s.recovery)[:16]
        text = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        prompt = tiny_tokenizer(text, add_special_tokens=False)["input_ids"][-(200 - len(rec)) :]
        ids = torch.tensor([prompt + rec])
        with torch.no_grad():
            logits = tiny_model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        per_site.append(float(F.cross_entropy(logits, torch.tensor(rec))))
        n += len(rec)
    assert got["n_recovery_tokens"] == n
    assert got["per_site"]["recovery_ce"] == pytest.approx(per_site, rel=1e-5)
    assert got["recovery_ce"] == pytest.approx(sum(per_site) / 3, rel=1e-5)
    assert got["hinted_jsd"] > 0


def test_jsd_is_zero_when_the_hint_adds_nothing(traces, tiny_model, tiny_tokenizer):
    sites = error_sites(traces)[:2]
    # a site whose "hinted" rendering equals the plain one: patch the hint into the history instead
    same = [dataclasses.replace(s, hint="") for s in sites]
    ss = SiteSet(tiny_tokenizer, same, max_len=160)
    for r in ss.rows:
        r.hinted = list(r.prompt)
    assert ss.measure(tiny_model, greedy=False)["hinted_jsd"] == pytest.approx(0.0, abs=1e-7)


def test_greedy_answers_and_rates(traces, tiny_model, tiny_tokenizer):
    sites = error_sites(traces)[:4]
    ss = SiteSet(tiny_tokenizer, sites, pairs=recovery_pairs(traces)[:3], max_len=160, max_new_tokens=5)
    m = ss.measure(tiny_model)
    assert m["n_sites"] == 4 and len(m["answers"]) == 4
    assert m["valid_rate"] == sum(m["per_site"]["valid_rate"]) / 4
    for r, answer in zip(ss.rows, m["answers"], strict=True):
        ids = torch.tensor([r.prompt])
        ref = tiny_model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False,
            pad_token_id=0, eos_token_id=tiny_tokenizer.eos_token_id,
        )[0, ids.shape[1] :]  # fmt: skip
        assert answer == tiny_tokenizer.decode(ref, skip_special_tokens=True)
    assert 0 <= m["tool_match_rate"] <= m["valid_rate"] <= 1
    wins = 0
    for p in ss.pair_rows:  # mean token log-prob of each response after the shared prompt, one forward each
        mean = {}
        for side in ("chosen", "rejected"):
            resp = getattr(p, side)
            ids = torch.tensor([p.prompt + resp])
            with torch.no_grad():
                logits = tiny_model(input_ids=ids).logits[0, len(p.prompt) - 1 : -1]
            mean[side] = -float(F.cross_entropy(logits, torch.tensor(resp)))
        wins += mean["chosen"] > mean["rejected"]
    assert m["n_pairs"] == 3 and m["pref_accuracy"] == pytest.approx(wins / 3)


def test_tool_call_rate_counts_well_formed_calls_not_prose(traces, tiny_tokenizer):
    from composer_replication.wire import format_tool_use

    ss = SiteSet(tiny_tokenizer, error_sites(traces)[:3], max_len=160)
    call = format_tool_use("Bash", {"command": "ls"})
    m = ss._score(
        [call, "Let me look at the error first.", '[TOOL_USE] name=Bash input={"command": "ls'], [True] * 3
    )
    # a prose answer is a valid action with no call; a cut call is neither
    assert m["tool_call_rate"] == pytest.approx(1 / 3)
    assert m["per_site_actions"]["valid_rate"][1:] == [1.0, 0.0]


def test_an_answer_cut_by_the_budget_is_not_valid_even_as_prose(traces, tiny_tokenizer):
    from composer_replication.wire import format_tool_use

    ss = SiteSet(tiny_tokenizer, error_sites(traces)[:4], max_len=160)
    call = format_tool_use("Bash", {"command": "ls"})
    loop = "The function is defined in the function. " * 20
    m = ss._score([call, loop, loop, call], [True, True, False, False])
    # a looping prose answer that ran into the budget parses, but it is no action: well-formed, not valid
    assert m["per_site_actions"]["valid_rate"] == [1.0, 1.0, 0.0, 0.0]
    assert m["well_formed_rate"] == 1.0 and m["valid_rate"] == 0.5
    assert m["tool_call_rate"] == 0.25


def test_measure_counts_budget_cut_answers_invalid(traces, tiny_model, tiny_tokenizer):
    ss = SiteSet(tiny_tokenizer, error_sites(traces)[:3], max_len=160, max_new_tokens=3)
    m = ss.measure(tiny_model)
    assert m["truncated_rate"] > 0  # a random tiny model does not end within 3 tokens
    # the answers cut by the budget are not valid, whatever they parse as
    assert m["valid_rate"] <= min(m["well_formed_rate"], 1 - m["truncated_rate"]) + 1e-9


def test_no_sites_is_an_error(tiny_tokenizer):
    with pytest.raises(ValueError, match="no held-out error sites"):
        SiteSet(tiny_tokenizer, [])


def test_sites_without_a_hint_count_for_ce_but_not_for_jsd(traces, tiny_model, tiny_tokenizer):
    every = error_sites(traces)
    bare = [dataclasses.replace(every[0], hint=None, error_kind="user_rejected")]
    hinted = every[1:3]
    mixed = SiteSet(tiny_tokenizer, bare + hinted, max_len=160).measure(tiny_model, greedy=False)
    only = SiteSet(tiny_tokenizer, hinted, max_len=160).measure(tiny_model, greedy=False)
    assert "valid_rate" not in mixed
    assert mixed["n_hinted_sites"] == 2 and len(mixed["per_site"]["recovery_ce"]) == 3
    assert mixed["per_site"]["hinted_jsd"] == pytest.approx(only["per_site"]["hinted_jsd"], rel=1e-5)
    assert mixed["per_site"]["recovery_ce"][1:] == pytest.approx(only["per_site"]["recovery_ce"], rel=1e-5)


def test_recovery_pairs_at_the_recovery_state_end_with_the_error_result(traces):
    from composer_replication import wire

    after = recovery_pairs(traces, at="recovery")
    assert after
    for p in after:  # the state holds the failed call and its error result, then the recovery is chosen
        msgs = p["state_messages"]
        k = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        assert any(m["role"] == "tool" and m["is_error"] for m in msgs[k + 1 :])
        failed = wire.parse_openai_message(msgs[k])
        assert wire.canonical_action(p["rejected"]) == wire.canonical_action(
            wire.action_text(failed.text, failed.tool_calls)
        )
        assert p["tools"] and all(t["type"] == "function" for t in p["tools"])
    with pytest.raises(ValueError, match="at='later'"):
        recovery_pairs(traces, at="later")  # type: ignore[arg-type]


@pytest.mark.parametrize("greedy", [True, False])
def test_progress_reports_every_stage_once(traces, tiny_model, tiny_tokenizer, greedy):
    """``measure(progress=...)`` is called once per stage as it ends, ``stages()`` times in all (a
    progress bar's total), and leaves the numbers as they are."""
    sites = error_sites(traces)[:5]
    ss = SiteSet(tiny_tokenizer, sites, pairs=recovery_pairs(traces)[:3], max_len=160, max_new_tokens=3,
                 batch_size=2)  # fmt: skip
    seen: list[str] = []
    with_bar = ss.measure(tiny_model, greedy=greedy, progress=seen.append)
    assert len(seen) == ss.stages(greedy) == len(set(seen))
    assert seen[0] == "site0/prompt" and seen[-1] == "pair1/rejected"
    assert ("site2/greedy" in seen) == greedy and any(s.endswith("/hinted") for s in seen)
    assert ss.measure(tiny_model, greedy=greedy)["recovery_ce"] == with_bar["recovery_ce"]
