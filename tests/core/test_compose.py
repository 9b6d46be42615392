"""compose_loss and its channel functions on the tiny model, against references computed here
row by row; build_batch; the smoke command."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from composer_replication.batch import build_batch
from composer_replication.loss import (
    LossComponents,
    align_sdpo_positions,
    compose_loss,
    sequence_logprobs,
    token_logprobs,
)

REQUIRED = ("input_ids", "response_mask")
SDPO = ("ctx_teacher_input_ids", "sdpo_loss_mask")
PAIR = (
    "dpo_chosen_input_ids",
    "dpo_chosen_response_mask",
    "dpo_rejected_input_ids",
    "dpo_rejected_response_mask",
)


@pytest.fixture()
def batch(tiny_tokenizer):
    b = build_batch(tiny_tokenizer, variant="binary_search", seed=3)
    # distinct, non-zero reference log-probs so that the DPO reference actually enters
    b["dpo_chosen_ref_logprobs"] = torch.tensor([-420.0, -515.0])
    b["dpo_rejected_ref_logprobs"] = torch.tensor([-380.0, -371.0])
    return b


def _row_positions(mask_row):
    return [p for p in range(1, mask_row.shape[0]) if mask_row[p]]


def _ref_seq_logp(model, ids, mask, b):
    """Sum of response-token log-probs of row b, from a forward on that row alone, unpadded."""
    n = int(mask[b].nonzero().max()) + 1
    logits = model(input_ids=ids[b : b + 1, :n]).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return sum(lp[p - 1, ids[b, p]] for p in _row_positions(mask[b, :n]))


def _jsd64(s, t, beta=0.5):
    ps, pt = torch.softmax(s.double(), -1), torch.softmax(t.double(), -1)
    m = (1 - beta) * ps + beta * pt
    return beta * (pt * (pt / m).log()).sum(-1) + (1 - beta) * (ps * (ps / m).log()).sum(-1)


def test_total_is_weighted_sum_of_channels_that_match_references(tiny_model, batch):
    alpha, beta_r, dpo_beta = 0.3, 0.7, 0.2
    tiny_model.double()  # a random tiny model's JSD is ~1e-5: compare in float64, not float32 rounding
    out = compose_loss(
        tiny_model, batch, alpha_sdpo=alpha, beta_replay=beta_r, replay_dpo_beta=dpo_beta, replay_rpo_alpha=0.0
    )
    assert isinstance(out, LossComponents)
    torch.testing.assert_close(out.total, out.lm_ce + alpha * out.sdpo_jsd + beta_r * out.trace_replay_dpo)
    assert set(out.detached()) == {"lm_ce", "sdpo_jsd", "trace_replay_dpo", "total"}

    with torch.no_grad():
        ids, resp = batch["input_ids"], batch["response_mask"]
        # channel 1: mean CE over all response tokens of the batch
        ces = []
        for b in range(ids.shape[0]):
            logits = tiny_model(input_ids=ids[b : b + 1]).logits[0].double()
            ces += [F.cross_entropy(logits[p - 1], ids[b, p]) for p in _row_positions(resp[b])]
        torch.testing.assert_close(out.lm_ce.double(), torch.stack(ces).mean(), rtol=1e-6, atol=0)
        # channel 2: the student's response tokens paired in order with the teacher's masked tokens
        jsds = []
        for b in range(ids.shape[0]):
            s_logits = tiny_model(input_ids=ids[b : b + 1]).logits[0]
            t_ids = batch["ctx_teacher_input_ids"]
            t_logits = tiny_model(input_ids=t_ids[b : b + 1]).logits[0]
            sp, tp = _row_positions(resp[b]), _row_positions(batch["sdpo_loss_mask"][b])
            assert len(sp) == len(tp) and all(ids[b, i] == t_ids[b, j] for i, j in zip(sp, tp))
            jsds += [_jsd64(s_logits[i - 1], t_logits[j - 1]) for i, j in zip(sp, tp)]
        torch.testing.assert_close(out.sdpo_jsd.double(), torch.stack(jsds).mean(), rtol=1e-6, atol=0)
        # channel 3: sigmoid DPO on summed log-ratios, mean over pairs
        losses = []
        for b in range(ids.shape[0]):
            c = _ref_seq_logp(tiny_model, batch["dpo_chosen_input_ids"], batch["dpo_chosen_response_mask"], b)
            r = _ref_seq_logp(
                tiny_model, batch["dpo_rejected_input_ids"], batch["dpo_rejected_response_mask"], b
            )
            delta = (c - batch["dpo_chosen_ref_logprobs"][b]) - (r - batch["dpo_rejected_ref_logprobs"][b])
            losses.append(-F.logsigmoid(dpo_beta * delta.double()))
        torch.testing.assert_close(
            out.trace_replay_dpo.double(), torch.stack(losses).mean(), rtol=1e-6, atol=0
        )
    assert out.metrics["sdpo/tokens"] == int(resp[:, 1:].sum())
    assert out.metrics["pref/pairs"] == 2


def test_simpo_variant_ignores_reference_logprobs(tiny_model, batch):
    kw = {"dpo_variant": "simpo", "simpo_beta": 2.5, "simpo_gamma": 0.4, "replay_rpo_alpha": 0.0}
    a = compose_loss(tiny_model, batch, **kw).trace_replay_dpo
    no_ref = {k: v for k, v in batch.items() if "ref_logprobs" not in k}
    b = compose_loss(tiny_model, no_ref, **kw).trace_replay_dpo
    torch.testing.assert_close(a, b)
    with torch.no_grad():
        avg = [
            sequence_logprobs(
                tiny_model, batch[f"dpo_{s}_input_ids"], batch[f"dpo_{s}_response_mask"], average=True
            )
            for s in ("chosen", "rejected")
        ]
    ref = -F.logsigmoid(2.5 * (avg[0] - avg[1]) - 0.4).mean()
    torch.testing.assert_close(a.detach(), ref, rtol=1e-5, atol=0)


@pytest.mark.parametrize("variant", ["dpo", "simpo"])
def test_rpo_adds_the_chosen_token_mean_nll_as_trl_does(tiny_model, batch, variant):
    """RPO (TRL's rpo_alpha / CPO's cpo_alpha): the preference loss plus alpha x F.cross_entropy over every
    chosen response token of the batch (one token mean, not a mean of per-pair means)."""
    tiny_model.double()
    kw = {"dpo_variant": variant, "beta_replay": 1.0, "alpha_sdpo": 0.0}
    plain = compose_loss(tiny_model, batch, **kw, replay_rpo_alpha=0.0)
    rpo = compose_loss(tiny_model, batch, **kw, replay_rpo_alpha=0.7)
    with torch.no_grad():
        ids, mask = batch["dpo_chosen_input_ids"], batch["dpo_chosen_response_mask"]
        logits, labels = [], []
        for b in range(ids.shape[0]):  # each chosen row alone, unpadded, as TRL's labels (-100 elsewhere)
            n = int(mask[b].nonzero().max()) + 1
            row = tiny_model(input_ids=ids[b : b + 1, :n]).logits[0].double()
            pos = _row_positions(mask[b, :n])
            logits.append(row[[p - 1 for p in pos]])
            labels.append(ids[b, pos])
        nll = F.cross_entropy(torch.cat(logits), torch.cat(labels))
    assert len(torch.cat(labels)) == int(mask[:, 1:].sum()) and ids.shape[0] == 2  # the rows differ in length
    torch.testing.assert_close(
        rpo.trace_replay_dpo.double(), plain.trace_replay_dpo.double() + 0.7 * nll, rtol=1e-6, atol=0
    )
    torch.testing.assert_close(rpo.metrics["pref/chosen_nll"], float(nll), rtol=1e-6, atol=0)
    assert "pref/chosen_nll" not in plain.metrics
    # the NLL term sends gradient to the chosen likelihood: it rises along the RPO gradient
    tiny_model.zero_grad()
    compose_loss(tiny_model, batch, **kw, replay_rpo_alpha=50.0).total.backward()
    grads = [p.grad.clone() for p in tiny_model.parameters()]
    with torch.no_grad():
        before = sequence_logprobs(tiny_model, ids, mask).sum()
        for p, g in zip(tiny_model.parameters(), grads, strict=True):
            p -= 1e-4 * g
        after = sequence_logprobs(tiny_model, ids, mask).sum()
    assert after > before


def test_sdpo_alignment_left_padded_equals_right_padded(tiny_model, tiny_tokenizer):
    tiny_model.double()
    right = build_batch(tiny_tokenizer, variant="factorial", seed=1)
    left = build_batch(tiny_tokenizer, variant="factorial", seed=1, align_sdpo_shapes=True)
    assert left["input_ids"].shape == left["ctx_teacher_input_ids"].shape
    assert right["input_ids"].shape != right["ctx_teacher_input_ids"].shape
    s_mask, t_mask = align_sdpo_positions(
        left["input_ids"], left["ctx_teacher_input_ids"], left["sdpo_loss_mask"], left["response_mask"]
    )
    assert torch.equal(s_mask, t_mask)  # aligned shapes: the same positions
    for wrapper in ("none", "taid", "entropy_opd"):
        a = compose_loss(tiny_model, right, sdpo_wrapper=wrapper, taid_t=0.6)
        b = compose_loss(tiny_model, left, sdpo_wrapper=wrapper, taid_t=0.6)
        torch.testing.assert_close(a.sdpo_jsd, b.sdpo_jsd, rtol=1e-6, atol=0)
        torch.testing.assert_close(a.lm_ce, b.lm_ce, rtol=1e-6, atol=0)


def test_sdpo_right_aligns_a_sub_span_and_rejects_mismatched_tokens(tiny_tokenizer):
    b = build_batch(tiny_tokenizer, variant="factorial")
    sub = b["sdpo_loss_mask"].clone()
    for row in range(sub.shape[0]):  # keep only the last 5 recovery tokens in the teacher mask
        pos = sub[row].nonzero().flatten()
        sub[row, pos[:-5]] = 0
    s_mask, t_mask = align_sdpo_positions(b["input_ids"], b["ctx_teacher_input_ids"], sub, b["response_mask"])
    assert torch.equal(s_mask.sum(-1), torch.tensor([5, 5]))
    assert torch.equal(b["input_ids"][s_mask], b["ctx_teacher_input_ids"][t_mask])
    shifted = b["sdpo_loss_mask"].roll(-1, dims=1)  # one position early: different tokens
    with pytest.raises(ValueError, match="sdpo_student_mask"):
        align_sdpo_positions(b["input_ids"], b["ctx_teacher_input_ids"], shifted, b["response_mask"])


@pytest.mark.parametrize("channel", ["sdpo", "pref"])
def test_channel_off_when_weight_zero_or_keys_missing(tiny_model, batch, channel):
    field, weight, keys = {
        "sdpo": ("sdpo_jsd", "alpha_sdpo", SDPO),
        "pref": (
            "trace_replay_dpo",
            "beta_replay",
            (*PAIR, "dpo_chosen_ref_logprobs", "dpo_rejected_ref_logprobs"),
        ),
    }[channel]
    full = compose_loss(tiny_model, batch, alpha_sdpo=0.5, beta_replay=0.5)
    assert getattr(full, field).item() != 0
    missing = {k: v for k, v in batch.items() if k not in keys}
    zero_weight = {"alpha_sdpo": 0.5, "beta_replay": 0.5, weight: 0.0}
    for out in (compose_loss(tiny_model, batch, **zero_weight),
                compose_loss(tiny_model, missing, alpha_sdpo=0.5, beta_replay=0.5)):  # fmt: skip
        off = getattr(out, field)
        assert off.item() == 0 and off.requires_grad and off.shape == ()
        rest = out.lm_ce + 0.5 * (out.sdpo_jsd + out.trace_replay_dpo)
        torch.testing.assert_close(out.total, rest)
        out.total.backward()  # a disabled channel still takes part in autograd
    only_required = compose_loss(tiny_model, {k: batch[k] for k in REQUIRED})
    assert only_required.sdpo_jsd.item() == only_required.trace_replay_dpo.item() == 0
    torch.testing.assert_close(only_required.total, only_required.lm_ce)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("lm_ce", {}),
        ("sdpo_jsd", {}),
        ("sdpo_jsd", {"sdpo_wrapper": "taid", "taid_t": 0.7}),
        ("sdpo_jsd", {"sdpo_wrapper": "entropy_opd", "sdpo_temperature": 0.8}),
        ("sdpo_jsd", {"sdpo_jsd_beta": 0.0, "sdpo_top_k": 16, "sdpo_token_clip": 1.0}),
        ("trace_replay_dpo", {}),
        ("trace_replay_dpo", {"dpo_variant": "simpo"}),
    ],
)
def test_each_channel_alone_sends_gradient_to_the_model(tiny_model, batch, field, kwargs):
    out = compose_loss(tiny_model, batch, **kwargs)
    getattr(out, field).backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and any(bool((g != 0).any()) for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)


def test_token_and_sequence_logprobs_agree(tiny_model, batch):
    ids, resp = batch["dpo_chosen_input_ids"], batch["dpo_chosen_response_mask"]
    with torch.no_grad():
        seq = sequence_logprobs(tiny_model, ids, resp, attention_mask=batch["dpo_chosen_attention_mask"])
        for b in range(ids.shape[0]):
            torch.testing.assert_close(
                seq[b].double(), _ref_seq_logp(tiny_model, ids, resp, b), rtol=1e-5, atol=0
            )
    logits = torch.randn(2, 3, 5, dtype=torch.float64)
    labels = torch.tensor([[1, -100, 4], [0, 2, -100]])
    expect = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None])[..., 0] * (
        labels != -100
    )
    torch.testing.assert_close(token_logprobs(logits, labels), expect)


def test_build_batch_ref_model_and_contents(tiny_model, tiny_tokenizer):
    b = build_batch(tiny_tokenizer, variant="factorial", ref_model=tiny_model)
    for side in ("chosen", "rejected"):
        with torch.no_grad():
            expect = sequence_logprobs(tiny_model, b[f"dpo_{side}_input_ids"], b[f"dpo_{side}_response_mask"])
        torch.testing.assert_close(b[f"dpo_{side}_ref_logprobs"], expect, rtol=1e-5, atol=1e-4)
    # against its own reference, DPO starts at log 2 exactly
    out = compose_loss(tiny_model, b, alpha_sdpo=0.0, replay_rpo_alpha=0.0)  # plain DPO
    torch.testing.assert_close(out.trace_replay_dpo, torch.tensor(0.6931472), rtol=1e-4, atol=0)
    zeros = build_batch(tiny_tokenizer, variant="factorial")
    assert torch.all(zeros["dpo_chosen_ref_logprobs"] == 0)
    text = tiny_tokenizer.decode(b["input_ids"][0][b["response_mask"][0].bool()])
    assert text.startswith("[TOOL_USE] name=Read") and "<|im_end|>" in text
    teacher_text = tiny_tokenizer.decode(b["ctx_teacher_input_ids"][0])
    assert "[HINT] " in teacher_text and "[HINT] " not in tiny_tokenizer.decode(b["input_ids"][0])
    assert not torch.equal(
        build_batch(tiny_tokenizer, seed=1)["input_ids"], build_batch(tiny_tokenizer, seed=2)["input_ids"]
    )
    assert torch.equal(
        build_batch(tiny_tokenizer, seed=5)["input_ids"], build_batch(tiny_tokenizer, seed=5)["input_ids"]
    )


def test_build_batch_errors(tiny_tokenizer):
    with pytest.raises(ValueError, match="variant"):
        build_batch(tiny_tokenizer, variant="quicksort")
    no_template = type("T", (), {"chat_template": None, "pad_token_id": 0, "eos_token_id": 0})()
    with pytest.raises(ValueError, match="chat_template"):
        build_batch(no_template)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"dpo_variant": "ipo"}, "dpo_variant"),
        ({"sdpo_wrapper": "gkd"}, "sdpo_wrapper"),
        ({"sdpo_wrapper": "taid"}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": 1.2}, "taid_t"),
        ({"sdpo_wrapper": "taid", "taid_t": -0.1}, "taid_t"),
        ({"replay_rpo_alpha": -0.5}, "replay_rpo_alpha"),
    ],
)
def test_compose_loss_bad_options(tiny_model, batch, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        compose_loss(tiny_model, batch, **kwargs)


def test_compose_loss_bad_inputs(tiny_model, batch):
    cases = [
        ({k: v for k, v in batch.items() if k != "response_mask"}, "response_mask"),
        ({**batch, "response_mask": batch["response_mask"][:, :-1]}, "response_mask"),
        ({**batch, "input_ids": batch["input_ids"].float()}, "input_ids"),
        ({k: v for k, v in batch.items() if k != "sdpo_loss_mask"}, "sdpo_loss_mask"),
        ({**batch, "sdpo_loss_mask": batch["sdpo_loss_mask"][:, 1:]}, "sdpo_loss_mask"),
        ({k: v for k, v in batch.items() if k != "dpo_rejected_input_ids"}, "dpo_rejected_input_ids"),
        ({k: v for k, v in batch.items() if k != "dpo_chosen_ref_logprobs"}, "ref_logprobs"),
        ({**batch, "dpo_chosen_ref_logprobs": torch.zeros(3)}, "same B"),
    ]
    for inputs, needle in cases:
        with pytest.raises(ValueError, match=needle):
            compose_loss(tiny_model, inputs, alpha_sdpo=0.2, beta_replay=0.2)


def test_smoke_command_prints_each_channel_per_step(capsys):
    from composer_replication.cli.main import main

    assert main(["smoke", "--tiny", "--steps", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    lines = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    assert [ln[0] for ln in lines] == ["0", "1"]
    assert "lm_ce" in out and "sdpo" in out and "pref" in out
    assert all(float(x) > 0 for ln in lines for x in ln[2:4])


def test_build_batch_with_a_template_that_rejects_system_messages(tiny_tokenizer):
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ '<start_of_turn>' + m['role'] + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>assistant\n' }}{% endif %}"
    )
    b = build_batch(tok, variant="binary_search")
    text = tok.decode(b["input_ids"][0])
    assert "<start_of_turn>system" not in text and "You are a coding agent" in text
    resp = tok.decode(b["input_ids"][0][b["response_mask"][0].bool()])
    assert resp.startswith("[TOOL_USE] name=Edit")
