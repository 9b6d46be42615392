"""On-policy SDPO at error sites: sites, sampling, the batch, training with it, and exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from composer_replication.generation import engine
from composer_replication.trainer import error_sites as es
from composer_replication.trainer.offline import onpolicy as op
from composer_replication.trainer.offline.loop import train_offline

from ..conftest import tiny_config


def rows(path):
    from composer_replication.ingestion import read_rows  # an ingest's references come back materialised

    return list(read_rows(path))


def test_error_sites_of_real_traces(ingested):
    traces = rows(ingested / "traces.jsonl")
    sites = es.error_sites(traces)
    assert len(sites) >= 8
    assert len({s.site_id for s in sites}) == len(sites)
    for s in sites:
        assert s.turns[-1]["role"] in ("tool", "user") and s.recovery.strip() and s.hint
        assert any(t.get("role") == "tool" and t.get("tool_error") is not None for t in s.turns)
        student, teacher = es.site_messages(s, hinted=False), es.site_messages(s, hinted=True)
        assert s.schemas and [t["function"]["name"] for t in s.schemas] == list(s.tools)
        if student[-1]["role"] == "user":  # the hint ends the user text after the failure
            assert teacher[:-1] == student[:-1]
            assert teacher[-1]["content"] == student[-1]["content"] + f"\n\n[HINT] {s.hint}"
        else:  # ... or follows the failed result as a message of its own
            assert student[-1]["role"] == "tool" and teacher[:-1] == student
            assert teacher[-1] == {"role": "user", "content": f"[HINT] {s.hint}"}
    # overlapping windows of one session repeat sites: they are counted once
    assert len(es.error_sites(traces + traces)) == len(sites)


def test_greedy_sampling_matches_transformers_generate(tiny_model, tiny_tokenizer):
    prompts = [[5, 17, 23, 99, 4], [7, 8]]
    eos = [tiny_tokenizer.eos_token_id]
    got = engine.sample(tiny_model, prompts, max_new_tokens=6, temperature=0, eos_ids=eos, pad_id=0)
    assert_each_row_matches_generate(tiny_model, prompts, got, eos, 6)


def assert_each_row_matches_generate(model, prompts, got, eos, max_new_tokens):
    """Every batched answer equals ``generate`` run on its prompt alone (greedy, same EOS ids)."""
    for p, g in zip(prompts, got, strict=True):
        ids = torch.tensor([p])
        ref = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            do_sample=False, pad_token_id=0, eos_token_id=eos,
        )[0, len(p) :].tolist()  # fmt: skip
        assert g == ref[: len(g)] and len(g) == len(ref)


def test_greedy_rows_that_finish_early_leave_the_batch_without_changing_the_others(tiny_model):
    # EOS ids taken from the rows' own greedy paths, so rows end at different steps: the finished ones
    # are dropped from the batch (and its KV cache) and each row must still match a run of its own.
    prompts = [[5, 17, 23, 99, 4], [7, 8], [31, 32, 33], [40, 41, 42, 43]]
    free = engine.sample(tiny_model, prompts, max_new_tokens=10, temperature=0, eos_ids=[], pad_id=0)
    eos = sorted({free[0][1], free[2][5]})
    got = engine.sample(tiny_model, prompts, max_new_tokens=10, temperature=0, eos_ids=eos, pad_id=0)
    assert len({len(g) for g in got}) > 1  # the rows did finish at different steps
    assert_each_row_matches_generate(tiny_model, prompts, got, eos, 10)


def test_sampling_is_a_function_of_the_generator(tiny_model):
    prompts = [[5, 17, 23], [7, 8, 9, 10]]
    kw = dict(max_new_tokens=8, temperature=1.0, eos_ids=[], pad_id=0)
    state = torch.random.get_rng_state()
    a = engine.sample(tiny_model, prompts, generator=torch.Generator().manual_seed(3), **kw)
    b = engine.sample(tiny_model, prompts, generator=torch.Generator().manual_seed(3), **kw)
    c = engine.sample(tiny_model, prompts, generator=torch.Generator().manual_seed(4), **kw)
    assert a == b and a != c and all(len(x) == 8 for x in a)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched


def test_batch_pairs_student_and_teacher_on_the_sample():
    b = op.sdpo_batch([[1, 2, 3], [4, 5]], [[1, 2, 3, 9, 9], [4, 5, 9]], [[7, 8], []], pad_id=0)
    assert b["input_ids"].tolist() == [[1, 2, 3, 7, 8]]  # the row with no sample is left out
    assert b["ctx_teacher_input_ids"].tolist() == [[1, 2, 3, 9, 9, 7, 8]]
    assert b["input_ids"][b["sdpo_student_mask"].bool()].tolist() == [7, 8]
    assert b["ctx_teacher_input_ids"][b["sdpo_loss_mask"].bool()].tolist() == [7, 8]
    assert op.sdpo_batch([[1]], [[1]], [[]], pad_id=0) is None


def test_sample_cache_round_trip(tmp_path):
    cache = op.SampleCache(tmp_path / "s.jsonl")
    cache.put({"0:1:0:a": [1, 2], "0:1:0:b": []})
    assert op.SampleCache(tmp_path / "s.jsonl").samples == {"0:1:0:a": [1, 2], "0:1:0:b": []}


def _on_policy_cfg(small_data, **extra):
    sections = {
        "loss": {"sdpo": {"weight": 1.0, "source": "on_policy", "on_policy": {"max_new_tokens": 6}},
                 "preference": {"weight": 0.0}},
        "schedule": {"max_steps": 6, "batch_size": 2},
    }  # fmt: skip
    sections.update(extra)
    return tiny_config(small_data, **sections)


def test_on_policy_training_scores_the_students_samples(small_data, tmp_path, one_thread):
    train_offline(_on_policy_cfg(small_data), out_dir=tmp_path)
    log = rows(tmp_path / "metrics.jsonl")
    assert all(r["sdpo/tokens"] > 0 and r["loss/sdpo_jsd"] > 0 for r in log)
    assert all(0 < r["sdpo/sample_tokens"] <= 6 for r in log)
    for r in log:
        assert r["loss/total"] == pytest.approx(r["loss/lm_ce"] + r["loss/sdpo_jsd"], rel=1e-5)
    cached = rows(tmp_path / "sdpo_samples.jsonl")
    keys = [c["key"] for c in cached]
    assert len(keys) == len(set(keys)) == 6 * 2  # two sites per step, drawn once
    assert {k.split(":")[1] for k in keys} == {str(s) for s in range(6)}
    # the student's SDPO tokens (per step, as counted by the channel) are exactly the cached samples
    per_step = {}
    for c in cached:
        per_step.setdefault(int(c["key"].split(":")[1]), 0)
        per_step[int(c["key"].split(":")[1])] += len(c["tokens"])
    assert [r["sdpo/tokens"] for r in log] == [float(per_step[s]) for s in range(6)]


def test_on_policy_resume_is_exact_and_reuses_the_samples(small_data, tmp_path, one_thread):
    cfg = _on_policy_cfg(small_data, checkpoint={"every_steps": 0})
    reference = tmp_path / "reference"
    train_offline(cfg, out_dir=reference)

    from composer_replication.safety.kill_switch import KillSwitchTriggered

    calls = []

    def stop():
        calls.append(1)
        return "stop" if len(calls) == 4 else None

    run = tmp_path / "run"
    with pytest.raises(KillSwitchTriggered):
        train_offline(cfg, out_dir=run, stop=stop)
    drawn_before = rows(run / "sdpo_samples.jsonl")
    assert {c["key"].split(":")[1] for c in drawn_before} == {"0", "1", "2"}
    train_offline(cfg, out_dir=run, resume=True)
    assert rows(run / "metrics.jsonl") == rows(reference / "metrics.jsonl")
    assert rows(run / "sdpo_samples.jsonl") == rows(reference / "sdpo_samples.jsonl")


def test_on_policy_resume_uses_the_cached_samples_not_fresh_ones(small_data, tmp_path, one_thread):
    """A sample drawn before the crash is what the resumed run trains on, even if redrawing would differ."""
    cfg = _on_policy_cfg(
        small_data, schedule={"max_steps": 2, "batch_size": 2}, checkpoint={"every_steps": 1}
    )
    run = tmp_path / "run"
    train_offline(cfg, out_dir=run)
    first = rows(run / "metrics.jsonl")
    # pretend the run died after drawing step 2's samples but before checkpointing step 2:
    # the samples for step index 1 are replaced by one-token samples; resuming from step 1 must use them.
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-00000002")
    cached = rows(run / "sdpo_samples.jsonl")
    edited = [{**c, "tokens": c["tokens"][:1]} if c["key"].split(":")[1] == "1" else c for c in cached]
    (run / "sdpo_samples.jsonl").write_text("".join(json.dumps(c) + "\n" for c in edited))
    train_offline(cfg, out_dir=run, resume=True)
    log = rows(run / "metrics.jsonl")
    assert log[0] == first[0]
    assert log[1]["sdpo/tokens"] == 2.0 != first[1]["sdpo/tokens"]


def test_on_policy_without_error_sites_trains_without_sdpo(small_data, tmp_path):
    # on_policy is the default source, so traces without a failed tool call must still train (the SDPO
    # channel has nothing to distil, as with source: recorded); OnPolicySDPO itself refuses empty sites
    traces = [t for t in rows(small_data / "traces.jsonl")]
    for t in traces:
        for turn in t["turns"]:
            turn["tool_error"] = None
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
    cfg = _on_policy_cfg(small_data, data={"traces": str(tmp_path / "t.jsonl")})
    train_offline(cfg, out_dir=tmp_path / "run")
    log = rows(tmp_path / "run" / "metrics.jsonl")
    assert log and all(r.get("loss/sdpo_jsd", 0.0) == 0.0 and "sdpo/tokens" not in r for r in log)
    assert all(r["loss/lm_ce"] > 0 for r in log)
    with pytest.raises(ValueError, match="on_policy needs error sites"):
        op.OnPolicySDPO(None, [], cfg, 0)


def test_sites_without_a_hint_are_kept_only_on_request(ingested):
    traces = rows(ingested / "traces.jsonl")
    n = len(es.error_sites(traces))
    # the user rejected the first failed call: hint_generator has no template for that (the user said stop)
    t = next(t for t in traces if any(x.get("tool_error") is not None for x in t["turns"]))
    first = dict(next(x for x in t["turns"] if x.get("tool_error") is not None))
    for turn in (x for tr in traces for x in tr["turns"] if x == first):  # overlapping windows repeat it
        turn["error_meta"] = {**(turn.get("error_meta") or {}), "error_kind": "user_rejected"}
    hinted, every = es.error_sites(traces), es.error_sites(traces, need_hint=False)
    bare = [s for s in every if s.hint is None]
    assert len(bare) == 1 and len(hinted) == n - 1 and len(every) == n
    assert bare[0].error_kind == "user_rejected"
    with pytest.raises(ValueError, match="has no hint"):
        es.site_messages(bare[0], hinted=True)


def test_the_teacher_prompt_is_the_students_history_plus_the_hint(ingested, tiny_tokenizer):
    from composer_replication import encoding

    tok = tiny_tokenizer
    sites = [s for s in es.error_sites(rows(ingested / "traces.jsonl")) if len(s.turns) > 6]
    assert sites
    for s in sites[:5]:
        student, teacher = es.site_prompts(tok, s, 96)
        plain = encoding.render_prompt_ids(tok, es.site_messages(s, hinted=False), es.site_tools(s))
        hinted = encoding.render_prompt_ids(tok, es.site_messages(s, hinted=True), es.site_tools(s))
        assert student == plain[-96:] and len(plain) > 96  # the window is full: history was dropped
        assert teacher == hinted[-(96 + len(hinted) - len(plain)) :]
        # the teacher keeps every history token the student has, up to where the hint goes in ...
        tail = next(k for k in range(1, len(plain)) if plain[-k:] != hinted[-k:]) - 1
        assert teacher[: len(student) - tail] == student[: len(student) - tail]
        assert "[HINT]" in tok.decode(teacher) and "[HINT]" not in tok.decode(student)
        # ... where cutting both renders at the window would drop the hint's length of history
        assert es.prompt_ids(tok, es.site_messages(s, hinted=True), 96, es.site_tools(s))[:8] != student[:8]


def test_privileged_recovery_reaches_only_the_teacher(small_data, tiny_model, tiny_tokenizer):
    from composer_replication.config import build_config
    from composer_replication.wire import SOLUTION_PREFIX

    cfg = build_config(
        _on_policy_cfg(small_data, loss={"sdpo": {"weight": 1.0, "on_policy": {"max_new_tokens": 4,
                       "privileged": "recovery"}}, "preference": {"weight": 0.0}})
    )  # fmt: skip
    sites = es.error_sites(rows(small_data / "traces.jsonl"))
    policy = op.OnPolicySDPO(tiny_tokenizer, sites, cfg, seed=0)
    batch, _ = policy.batch(tiny_model, step=0, micro=0)
    assert batch is not None
    for s_row, t_row in zip(batch["input_ids"], batch["ctx_teacher_input_ids"], strict=True):
        s_text, t_text = tiny_tokenizer.decode(s_row), tiny_tokenizer.decode(t_row)
        assert SOLUTION_PREFIX.strip() in t_text and SOLUTION_PREFIX.strip() not in s_text
    # the sampled tokens the teacher scores are the student's
    s_tok = batch["input_ids"][batch["sdpo_student_mask"].bool()]
    t_tok = batch["ctx_teacher_input_ids"][batch["sdpo_loss_mask"].bool()]
    assert s_tok.tolist() == t_tok.tolist()
    with pytest.raises(Exception, match="privileged"):
        build_config(_on_policy_cfg(small_data, loss={"sdpo": {"on_policy": {"privileged": "answer"}}}))


def test_decode_into_the_kv_buffer_equals_decode_by_concatenation(tiny_model, monkeypatch):
    # decode writes the cache into a buffer allocated once (kv_buffer); the plain DynamicCache path
    # (torch.cat per step) must give the same tokens, greedy with rows leaving the batch and sampled
    from composer_replication.generation import kv_buffer

    prompts = [[5, 17, 23, 99, 4], [7, 8], [31, 32, 33], [40, 41, 42, 43]]
    free = engine.sample(tiny_model, prompts, max_new_tokens=12, temperature=0, eos_ids=[], pad_id=0)
    runs = [dict(temperature=0, eos_ids=sorted({free[0][2], free[2][6]})), dict(temperature=1.0, eos_ids=[])]
    buffered = []
    for kw in runs:
        g = torch.Generator().manual_seed(5)
        buffered.append(engine.sample(tiny_model, prompts, max_new_tokens=12, pad_id=0, generator=g, **kw))
    pre = engine.prefill(tiny_model.eval(), prompts, 0)
    engine.decode(tiny_model, pre, max_new_tokens=12, temperature=0, eos_ids=[])
    assert all(isinstance(layer, kv_buffer.BufferedLayer) for layer in pre.cache.layers)
    monkeypatch.setattr(kv_buffer, "buffer_cache", lambda cache, extra: cache)
    for kw, got in zip(runs, buffered, strict=True):
        g = torch.Generator().manual_seed(5)
        assert got == engine.sample(tiny_model, prompts, max_new_tokens=12, pad_id=0, generator=g, **kw)
    assert len({len(x) for x in buffered[0]}) > 1  # greedy rows did leave the batch early


def test_kv_buffer_holds_the_concatenated_keys_and_refuses_overflow():
    from transformers.cache_utils import DynamicLayer

    from composer_replication.generation.kv_buffer import BufferedLayer

    k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
    ref, buf = DynamicLayer(), BufferedLayer(k, v, extra=3)
    ref.update(k, v)
    for m in (1, 2):
        new_k, new_v = torch.randn(3, 2, m, 8), torch.randn(3, 2, m, 8)
        want, got = ref.update(new_k, new_v), buf.update(new_k, new_v)
        assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    idx = torch.tensor([2, 0])
    ref.batch_select_indices(idx)
    buf.batch_select_indices(idx)
    assert torch.equal(ref.keys, buf.keys) and torch.equal(ref.values, buf.values)
    assert buf.get_seq_length() == 7
    with pytest.raises(ValueError, match="KV buffer full"):
        buf.update(torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8))
