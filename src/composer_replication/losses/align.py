"""Pairing the student's response tokens with the same tokens in the hint-augmented teacher context.

In SDPO the teacher is the same model shown a hint, so the teacher's sequence is longer and its copy of
the student's response sits at different positions. :func:`align_sdpo_positions` returns the two
boolean masks that select the same tokens, in the same order, in both sequences (any SDPO loss family
then compares the logits rows that predict them). Pure function of ids and masks, torch only.
"""

from __future__ import annotations

import torch

__all__ = ["align_sdpo_positions"]


def align_sdpo_positions(
    input_ids: torch.Tensor,
    ctx_teacher_input_ids: torch.Tensor,
    sdpo_loss_mask: torch.Tensor,
    response_mask: torch.Tensor | None = None,
    student_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean ``(student_mask_BTs, teacher_mask_BTt)`` selecting the same tokens in both sequences.

    The teacher's tokens are those of ``sdpo_loss_mask``. The student's are, in order of preference:
    ``student_mask`` if given; the same positions when both sequences have the same length and the
    tokens there agree (e.g. ``build_batch(align_sdpo_shapes=True)``); otherwise the last ``n_b`` tokens
    of the student's ``response_mask`` in each row ``b`` (``n_b`` = the row's teacher count), i.e. the
    spans are right-aligned — the recovery tokens end both sequences, the hint only sits earlier in the
    teacher's context. The k-th selected student token is paired with the k-th teacher token of the
    row, and their ids must be equal: anything else raises ``ValueError``.
    """
    if torch.is_floating_point(ctx_teacher_input_ids) or ctx_teacher_input_ids.dim() != 2:
        raise ValueError("ctx_teacher_input_ids must be a (B, T_t) integer tensor of token ids")
    if tuple(sdpo_loss_mask.shape) != tuple(ctx_teacher_input_ids.shape):
        raise ValueError(
            f"sdpo_loss_mask {tuple(sdpo_loss_mask.shape)} must have the shape of "
            f"ctx_teacher_input_ids {tuple(ctx_teacher_input_ids.shape)}"
        )
    if input_ids.shape[0] != ctx_teacher_input_ids.shape[0]:
        raise ValueError(
            f"input_ids has B={input_ids.shape[0]} rows but ctx_teacher_input_ids has "
            f"B={ctx_teacher_input_ids.shape[0]}; build one teacher context per student row"
        )
    t_mask = sdpo_loss_mask.bool()
    if bool(t_mask[:, 0].any()):
        raise ValueError(
            "sdpo_loss_mask marks position 0, which no logits predict; mask response tokens only"
        )
    n_t = t_mask.sum(-1)

    def agrees(s_mask: torch.Tensor) -> bool:
        if not torch.equal(s_mask.sum(-1), n_t) or bool(s_mask[:, 0].any()):
            return False
        return torch.equal(input_ids[s_mask], ctx_teacher_input_ids[t_mask])

    if student_mask is not None:
        s_mask = student_mask.bool()
        if tuple(s_mask.shape) != tuple(input_ids.shape) or not agrees(s_mask):
            raise ValueError(
                "sdpo_student_mask must have the shape of input_ids and select, row by row, the same "
                "token ids as sdpo_loss_mask selects in ctx_teacher_input_ids"
            )
        return s_mask, t_mask
    if input_ids.shape == ctx_teacher_input_ids.shape and agrees(t_mask):
        return t_mask, t_mask
    if response_mask is not None:
        resp = response_mask.bool()
        from_end = resp.flip(-1).long().cumsum(-1).flip(-1)  # response tokens at or after each position
        s_mask = resp & (from_end <= n_t.unsqueeze(-1))
        if agrees(s_mask):
            return s_mask, t_mask
    raise ValueError(
        "the tokens selected by sdpo_loss_mask in ctx_teacher_input_ids are not the last response tokens "
        "of input_ids (nor at the same positions); mark the same response tokens in both, or pass "
        "'sdpo_student_mask' (B, T_s) selecting them in input_ids"
    )
