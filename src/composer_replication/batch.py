"""A complete three-channel batch from coding-agent tool-error scenarios, for any chat tokenizer.

Each row is one tool-error site from a coding-agent session (rendered in the one wire format,
:mod:`composer_replication.wire`: action lines, tool results, the ``[HINT]`` marker):

- **student** (``input_ids``): the conversation up to the tool error, then the student's recovery
  action (``response_mask`` = the recovery tokens, end-of-turn included);
- **teacher context** (``ctx_teacher_input_ids``): the same conversation with a hint appended to the
  tool-result message, then the *same* recovery tokens (``sdpo_loss_mask`` marks them);
- **preference pair** (``dpo_*``): at the state before the mistake, the action the teachers agree on
  (chosen) against the student's failing action (rejected).

Variants: ``"factorial"`` (an ``Edit`` whose ``old_string`` is not in the file) and
``"binary_search"`` (a failing test run with an off-by-one ``IndexError``). ``seed`` picks the file
names and details of the two rows (``random.Random(seed)``; the global torch RNG is left alone).

Reference log-probs: with ``ref_model`` they are the summed response log-probs of that model (under
``no_grad``) — pass the initial policy. Without it they are **zeros**, which turns DPO into its
reference-free form ``-log σ(β·(log π(y_w) - log π(y_l)))``; that is stated here, not hidden.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from composer_replication import wire
from composer_replication.encoding import pad_id, stack_prompt_response

__all__ = ["build_batch", "VARIANTS"]

VARIANTS = ("factorial", "binary_search")

SYSTEM = (
    "You are a coding agent working in a repository. Act with one tool call at a time: "
    "Read, Edit, Write or Bash."
)


def _tool(name: str, **inp: Any) -> str:
    return wire.format_tool_use(name, inp)


def _result(name: str, text: str, is_error: bool = True) -> str:
    return wire.format_tool_result(name, text, is_error)


def _factorial(rng: random.Random) -> dict[str, Any]:
    path = rng.choice(["mathx.py", "numtools.py", "utils/math_utils.py", "lib/combinatorics.py"])
    old = rng.choice(["def fact(n):", "def factorial(x):", "def fac(n):"])
    failing = _tool("Edit", file_path=path, old_string=old, new_string="def factorial(n: int) -> int:")
    request = {
        "role": "user",
        "content": f"Add factorial(n) to {path}; it must raise ValueError for negative n. Then run the tests.",
    }
    state = [{"role": "system", "content": SYSTEM}, request]
    error = _result("Edit", f"String to replace not found in file.\nString: {old}")
    return {
        "context": [*state, {"role": "assistant", "content": failing}, {"role": "user", "content": error}],
        "recovery": _tool("Read", file_path=path),
        "hint": f"The edit failed because `{old}` is not in {path}. Read the file and copy the exact text.",
        "pair_state": state,
        "chosen": _tool("Read", file_path=path),
        "rejected": failing,
    }


def _binary_search(rng: random.Random) -> dict[str, Any]:
    path = rng.choice(["search.py", "algos/search.py", "src/bsearch.py"])
    test = rng.choice(["tests/test_search.py", "tests/test_algos.py"])
    line = rng.randint(5, 12)
    run = _tool("Bash", command=f"python -m pytest {test} -q")
    request = {"role": "user", "content": f"binary_search in {path} crashes on some inputs; fix it."}
    error = _result(
        "Bash",
        f"E       IndexError: list index out of range\n{path}:{line}: in binary_search\n    if a[mid] == x:",
    )
    context = [
        {"role": "system", "content": SYSTEM},
        request,
        {"role": "assistant", "content": run},
        {"role": "user", "content": error},
    ]
    fix = _tool("Edit", file_path=path, old_string="hi = len(a)", new_string="hi = len(a) - 1")
    return {
        "context": context,
        "recovery": fix,
        "hint": "With `while lo <= hi`, the upper bound must start at len(a) - 1, not len(a).",
        "pair_state": context,
        "chosen": fix,
        "rejected": run,
    }


_SCENARIOS = {"factorial": _factorial, "binary_search": _binary_search}


def _without_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    # For templates that reject a system role (e.g. Gemma's): fold it into the first user message.
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    return rest


def _encode(tokenizer: Any, messages: list[dict[str, str]], response: str) -> tuple[list[int], list[int]]:
    """Prompt ids and response ids, tokenised separately so the response tokens never depend on the prompt."""
    try:
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja raises TemplateError (or others) for an unsupported role
        messages = _without_system(messages)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": response}], tokenize=False
    )
    if not full.startswith(prompt):
        raise ValueError(
            "the tokenizer's chat template does not render the conversation as a prefix of the conversation "
            "plus an assistant reply; build_batch needs a template where it does (e.g. ChatML)"
        )
    enc = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return enc(prompt), enc(full[len(prompt) :])


def build_batch(
    tokenizer: Any,
    *,
    device: torch.device | str = "cpu",
    seed: int = 42,
    variant: str = "factorial",
    align_sdpo_shapes: bool = False,
    ref_model: Any | None = None,
    batch_size: int = 2,
) -> dict[str, torch.Tensor]:
    """Build a full three-channel batch (``batch_size`` rows) for ``compose_loss``.

    Returns the keys of the API reference — ``input_ids``, ``response_mask``, ``ctx_teacher_input_ids``,
    ``sdpo_loss_mask``, ``dpo_{chosen,rejected}_{input_ids,response_mask,ref_logprobs}`` — plus the
    attention masks ``attention_mask``, ``ctx_teacher_attention_mask``, ``dpo_{chosen,rejected}_attention_mask``.
    Sequences are right-padded. With ``align_sdpo_shapes=True`` the student and teacher sequences are
    instead left-padded to one common length, so the recovery tokens sit at the same positions in both
    (``sdpo_loss_mask`` then marks the same tokens in ``input_ids``); without it, ``compose_loss``
    aligns the spans itself (see ``loss.align_sdpo_positions``).

    Raises:
        ValueError: unknown ``variant``; a tokenizer without a usable chat template; ``batch_size < 1``.
    """
    if variant not in _SCENARIOS:
        raise ValueError(f"variant={variant!r} is unknown; use one of {VARIANTS}")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat_template; set tokenizer.chat_template (e.g. a ChatML template)"
        )
    rng = random.Random(seed)
    rows = [_SCENARIOS[variant](rng) for _ in range(batch_size)]
    batch = {k: v.to(device) for k, v in _stack(tokenizer, rows, align_sdpo_shapes).items()}
    batch.update(_ref_logprobs(batch, ref_model, batch_size, device))
    return batch


def _stack(tokenizer: Any, rows: list[dict[str, Any]], align_sdpo_shapes: bool) -> dict[str, torch.Tensor]:
    """The scenario rows encoded and padded: student and hinted teacher (the very same recovery token
    ids; left-padded to one length with ``align_sdpo_shapes``), chosen and rejected."""
    student, teacher, chosen, rejected = [], [], [], []
    for row in rows:
        prompt, response = _encode(tokenizer, row["context"], row["recovery"])
        student.append((prompt, response))
        hinted = wire.add_hint(row["context"], row["hint"])
        t_prompt, _ = _encode(tokenizer, hinted, row["recovery"])
        teacher.append((t_prompt, response))  # the very same recovery token ids
        chosen.append(_encode(tokenizer, row["pair_state"], row["chosen"]))
        rejected.append(_encode(tokenizer, row["pair_state"], row["rejected"]))

    pad = pad_id(tokenizer)
    common = max(len(p) + len(r) for p, r in student + teacher) if align_sdpo_shapes else None
    ids, resp, attn = stack_prompt_response(student, pad, length=common, left=align_sdpo_shapes)
    t_ids, t_resp, t_attn = stack_prompt_response(teacher, pad, length=common, left=align_sdpo_shapes)
    c_ids, c_resp, c_attn = stack_prompt_response(chosen, pad)
    r_ids, r_resp, r_attn = stack_prompt_response(rejected, pad)
    return {
        "input_ids": ids,
        "response_mask": resp,
        "attention_mask": attn,
        "ctx_teacher_input_ids": t_ids,
        "sdpo_loss_mask": t_resp,
        "ctx_teacher_attention_mask": t_attn,
        "dpo_chosen_input_ids": c_ids,
        "dpo_chosen_response_mask": c_resp,
        "dpo_chosen_attention_mask": c_attn,
        "dpo_rejected_input_ids": r_ids,
        "dpo_rejected_response_mask": r_resp,
        "dpo_rejected_attention_mask": r_attn,
    }


def _ref_logprobs(
    batch: dict[str, torch.Tensor], ref_model: Any | None, batch_size: int, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """``dpo_{chosen,rejected}_ref_logprobs``: the reference model's summed response log-probs, or
    zeros without one."""
    if ref_model is None:
        zeros = torch.zeros(batch_size, dtype=torch.float32, device=device)
        return {"dpo_chosen_ref_logprobs": zeros, "dpo_rejected_ref_logprobs": zeros.clone()}
    from composer_replication.loss import sequence_logprobs

    with torch.no_grad():
        return {
            f"dpo_{side}_ref_logprobs": sequence_logprobs(
                ref_model,
                batch[f"dpo_{side}_input_ids"],
                batch[f"dpo_{side}_response_mask"],
                attention_mask=batch[f"dpo_{side}_attention_mask"],
            ).float()
            for side in ("chosen", "rejected")
        }
