"""``composer_replication.encoding``: the one padding and prompt/response encoding of the loss seam."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from composer_replication.encoding import (
    encode_response,
    pad_id,
    pad_rows,
    render_prompt_ids,
    stack_prompt_response,
)


def test_pad_rows_right_left_and_fixed_length():
    rows = [[1, 2, 3], [4], []]
    assert pad_rows(rows, 0).tolist() == [[1, 2, 3], [4, 0, 0], [0, 0, 0]]
    assert pad_rows(rows, 9, left=True).tolist() == [[1, 2, 3], [9, 9, 4], [9, 9, 9]]
    assert pad_rows(rows, 0, length=5).tolist()[1] == [4, 0, 0, 0, 0]
    assert pad_rows([[]], 7).tolist() == [[7]]  # never a zero-width tensor
    assert pad_rows(rows, 0).dtype == torch.long


def test_pad_id_falls_back_to_eos_then_zero():
    assert pad_id(SimpleNamespace(pad_token_id=3, eos_token_id=5)) == 3
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=5)) == 5
    assert pad_id(SimpleNamespace(pad_token_id=None, eos_token_id=None)) == 0


def test_response_keeps_its_tokens_and_the_prompt_is_cut_from_the_left(tiny_tokenizer):
    prompt = render_prompt_ids(tiny_tokenizer, [{"role": "user", "content": "read the file " * 20}])
    assert tiny_tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    ids, mask = encode_response(tiny_tokenizer, prompt, "[TOOL_USE] name=Read", max_len=24)
    n = sum(mask)
    assert len(ids) == 24 and mask == [0] * (24 - n) + [1] * n
    assert tiny_tokenizer.decode(ids[-n:]) == "[TOOL_USE] name=Read<|im_end|>"
    assert ids[: 24 - n] == prompt[-(24 - n) :]


def test_stack_gives_ids_response_and_attention_masks():
    ids, resp, attn = stack_prompt_response([([1, 2], [3]), ([4], [5, 6, 7])], pad=0, left=True)
    assert ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert resp.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1]]
    assert attn.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
