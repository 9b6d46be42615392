"""The engine's own behaviour: stop strings, finish reasons, log-probabilities (against a float64
forward), seeds, batching, parameter checks, and that the package imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from composer_replication.generation import Completion, GenerationParams, LocalEngine, tool_calls

PROMPTS = [[5, 17, 23, 99, 4, 61], [7, 8], [31, 32, 33, 34, 35, 36, 37, 38]]


@pytest.fixture()
def engine(tiny_tokenizer):
    from composer_replication.models import build_tiny_model

    model = build_tiny_model(tokenizer=tiny_tokenizer, seed=2, initializer_range=0.2)
    return LocalEngine(model, tiny_tokenizer)


def test_stop_strings_end_the_row_and_are_cut_from_the_text(engine, tiny_tokenizer):
    free = engine.generate(PROMPTS, GenerationParams(max_new_tokens=24))
    assert all(c.finish_reason == "length" and not c.complete for c in free)
    text = free[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a piece of the middle of row 0's answer
    assert stop.strip() and text.find(stop) > 0
    got = engine.generate(PROMPTS, GenerationParams(max_new_tokens=24, stop=(stop, "never-there")))
    row = got[0]
    assert row.finish_reason == "stop" and row.complete
    assert row.text == text[: text.find(stop)]
    assert row.token_ids == free[0].token_ids[: len(row.token_ids)] and len(row.token_ids) < 24
    # the row ended at the token that completed the stop string, not later
    assert stop in tiny_tokenizer.decode(row.token_ids) and stop not in tiny_tokenizer.decode(
        row.token_ids[:-1]
    )
    for g, f in zip(got[1:], free[1:], strict=True):  # the other rows: unchanged, or cut where it occurs
        cut = f.text.find(stop)
        assert g.text == (f.text if cut < 0 else f.text[:cut])


def test_end_of_turn_tokens_end_a_row_and_stay_in_its_ids(engine):
    free = engine.generate(PROMPTS, GenerationParams(max_new_tokens=12))
    eos = free[1].token_ids[4]
    got = LocalEngine(engine.model, engine.tokenizer, eos_ids=[eos]).generate(
        PROMPTS, GenerationParams(max_new_tokens=12)
    )
    first = free[1].token_ids.index(eos)
    assert got[1].token_ids == free[1].token_ids[: first + 1] and got[1].finish_reason == "stop"
    assert got[1].completion_tokens == first + 1 and got[1].prompt_tokens == len(PROMPTS[1])


def test_logprobs_are_the_models_token_log_probabilities(engine):
    """Against one float64 forward of prompt + answer, unpadded, per row."""
    import copy

    got = engine.generate(
        PROMPTS, GenerationParams(max_new_tokens=10, temperature=0.9, seed=4, logprobs=True)
    )
    ref_model = copy.deepcopy(engine.model).double().eval()
    for p, c in zip(PROMPTS, got, strict=True):
        ids = torch.tensor([p + c.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(ref_model(input_ids=ids).logits[0].double(), -1)
        want = [float(logp[len(p) - 1 + k, t]) for k, t in enumerate(c.token_ids)]
        assert c.logprobs == pytest.approx(want, abs=2e-5)
    assert engine.generate(PROMPTS[:1], GenerationParams(max_new_tokens=3))[0].logprobs is None


def test_a_seed_fixes_the_draws_and_leaves_the_global_rng_alone(engine):
    params = GenerationParams(max_new_tokens=12, temperature=1.0, top_k=50, seed=9)
    state = torch.random.get_rng_state()
    a, b = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    c = engine.generate(PROMPTS, GenerationParams(max_new_tokens=12, temperature=1.0, top_k=50, seed=10))
    assert torch.equal(state, torch.random.get_rng_state())
    assert [x.token_ids for x in a] == [x.token_ids for x in b] != [x.token_ids for x in c]


def test_batches_and_messages(engine, tiny_tokenizer):
    from composer_replication import encoding

    msgs = [[{"role": "user", "content": f"fix test number {i}"}] for i in range(3)]
    params = GenerationParams(max_new_tokens=6)
    whole = engine.complete(msgs, params)
    ids = [encoding.render_prompt_ids(tiny_tokenizer, m) for m in msgs]
    assert [c.prompt_tokens for c in whole] == [len(i) for i in ids]
    singles = [engine.generate([i], params)[0] for i in ids]
    chunked = LocalEngine(engine.model, tiny_tokenizer, batch_size=2).complete(msgs, params)
    assert [c.token_ids for c in whole] == [c.token_ids for c in singles] == [c.token_ids for c in chunked]
    engine.model.train()
    engine.complete(msgs[:1], params)
    assert engine.model.training  # the caller's mode is given back


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"repetition_penalty": 0}, "repetition_penalty must be > 0"),
        ({"stop": "###"}, "stop must be a tuple of strings"),
    ],
)
def test_bad_parameters_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        GenerationParams(**kw)


def test_tool_calls_are_read_through_wire():
    from composer_replication import wire

    line = wire.format_tool_use("Bash", {"command": "ls"})
    c = Completion(text=f"Let me look.\n\n{line}", finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    assert tool_calls(c) == wire.tool_calls(c.text) == [{"name": "Bash", "input": {"command": "ls"}}]


def test_importing_the_package_loads_no_torch():
    code = (
        "import sys, composer_replication.generation as g; from composer_replication.generation import "
        "Completion, GenerationParams, tool_calls; assert 'torch' not in sys.modules, 'torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
