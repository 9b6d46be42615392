"""Held-out measurements at tool-error sites of whole sessions the model never trained on.

A site (``onpolicy.error_sites`` of held-out traces) is the history up to a failed tool result, the hint
for that failure and the recorded recovery (what the agent did next). :class:`SiteSet` tokenises the
sites once; :meth:`SiteSet.measure` scores one model:

- ``recovery_ce``: cross-entropy of the recorded recovery's tokens given the history (no hint): the mean
  over the site's tokens, then over sites (every site counts once, however long its recovery).
- ``hinted_jsd``: generalized JSD (beta 0.5) between the model without the hint and the same model given
  the hint, on the same recovery tokens (mean over tokens, then sites): how much of the hint the model
  has absorbed.
- ``valid_rate`` / ``tool_match_rate``: the greedy answer at the site, parsed with
  ``teacher_replay.actions`` and scored by ``wire.score_action``: a well-formed action; and a
  well-formed action calling the same tools as the recorded recovery.
- ``pref_accuracy``: over held-out recovery pairs (``offline_data.recovery_pairs``: the recovery chosen,
  the failed action rejected), the fraction whose chosen response has the higher mean token log-prob.

Every quantity is a mean over sites (or pairs) with its count in ``n_*``, and ``per_site`` holds the
per-site values (for paired before/after comparisons). Nothing is sampled: one model gives one number
per metric, and the spread across models comes from training seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from composer_replication.encoding import pad_rows
from composer_replication.trainer.onpolicy import ErrorSite, prompt_ids, sample, site_messages

METRICS = ("recovery_ce", "hinted_jsd", "valid_rate", "tool_match_rate", "pref_accuracy")


@dataclass
class _Row:
    site: ErrorSite
    student: list[int]  # history + recovery
    teacher: list[int]  # hinted history + the same recovery
    n_rec: int  # recovery tokens at the end of both rows
    prompt: list[int]  # history + generation prompt, for greedy answers
    tools: list[str] = field(default_factory=list)


def recovery_ids(tok: Any, messages: list[dict], recovery: str) -> list[int]:
    """The tokens the chat template adds for the assistant turn ``recovery`` after ``messages``."""
    head = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*messages, {"role": "assistant", "content": recovery}], tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template does not render the assistant turn after its header")
    return list(tok(full[len(head) :], add_special_tokens=False)["input_ids"])


class SiteSet:
    """Held-out error sites, tokenised once for :meth:`measure`.

    ``max_len`` caps each scored row (history cut from the left); ``max_recovery`` caps the recovery
    tokens scored per site; ``max_new_tokens`` is the greedy answer length; ``tools_by_trace`` gives each
    session's tool names (an answer naming another tool is not valid).
    """

    def __init__(
        self,
        tok: Any,
        sites: Sequence[ErrorSite],
        *,
        pairs: Sequence[dict] = (),
        max_len: int = 256,
        max_recovery: int = 48,
        max_new_tokens: int = 32,
        tools_by_trace: dict[str, list[str]] | None = None,
        batch_size: int = 4,
    ) -> None:
        if not sites:
            raise ValueError("no held-out error sites: the evaluation sessions hold no failed tool call")
        self.tok, self.pairs, self.max_len = tok, list(pairs), max_len
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.rows: list[_Row] = []
        for s in sites:
            msgs = site_messages(s, hinted=False)
            rec = recovery_ids(tok, msgs, s.recovery)[:max_recovery]
            room = max(8, max_len - len(rec))
            student = prompt_ids(tok, msgs, room) + rec
            teacher = prompt_ids(tok, site_messages(s, hinted=True), room) + rec
            trace = s.site_id.rsplit("::", 1)[0]
            tools = list((tools_by_trace or {}).get(trace, []))
            self.rows.append(_Row(s, student, teacher, len(rec), prompt_ids(tok, msgs, max_len), tools))

    def __len__(self) -> int:
        return len(self.rows)

    @torch.no_grad()
    def _ce_jsd(self, model: Any) -> dict[str, Any]:
        from composer_replication.loss import model_logits, token_logprobs
        from composer_replication.opsd import generalized_jsd_loss

        dev = next(model.parameters()).device
        ce, jsd_l, n = [], [], 0
        for i in range(0, len(self.rows), self.batch_size):
            chunk = self.rows[i : i + self.batch_size]
            s_ids, s_att = _pad([r.student for r in chunk], self.pad)
            t_ids, t_att = _pad([r.teacher for r in chunk], self.pad)
            s_log = model_logits(model, s_ids.to(dev), s_att.to(dev)).float()
            t_log = model_logits(model, t_ids.to(dev), t_att.to(dev)).float()
            for b, r in enumerate(chunk):
                ls, lt = len(r.student), len(r.teacher)
                s_rows = s_log[b, ls - r.n_rec - 1 : ls - 1]  # the rows predicting the recovery tokens
                t_rows = t_log[b, lt - r.n_rec - 1 : lt - 1]
                labels = s_ids[b, ls - r.n_rec : ls].to(dev)
                ce.append(-float(token_logprobs(s_rows[None], labels[None]).mean()))
                jsd_l.append(float(generalized_jsd_loss(s_rows[None], t_rows[None], beta=0.5)))
                n += r.n_rec
        return {
            "recovery_ce": sum(ce) / len(ce),
            "hinted_jsd": sum(jsd_l) / len(jsd_l),
            "n_recovery_tokens": float(n),
            "per_site": {"recovery_ce": ce, "hinted_jsd": jsd_l},
        }

    def greedy_answers(self, model: Any, eos_ids: Sequence[int]) -> list[str]:
        """The model's greedy answer at every site (batched, KV cache)."""
        out: list[str] = []
        for i in range(0, len(self.rows), self.batch_size * 2):
            chunk = self.rows[i : i + self.batch_size * 2]
            ids = sample(
                model, [r.prompt for r in chunk], max_new_tokens=self.max_new_tokens, temperature=0,
                eos_ids=eos_ids, pad_id=self.pad,
            )  # fmt: skip
            out += [self.tok.decode(x, skip_special_tokens=True) for x in ids]
        return out

    def _actions(self, model: Any) -> dict[str, Any]:
        from composer_replication.trainer.onpolicy import eos_token_ids
        from composer_replication.wire import score_action

        answers = self.greedy_answers(model, eos_token_ids(self.tok))
        scores = [
            score_action(a, {"student_action": r.site.recovery, "tools": r.tools})
            for a, r in zip(answers, self.rows, strict=True)
        ]
        valid = [float(s["valid"]) for s in scores]
        match = [float(s["tool_match"]) for s in scores]
        return {
            "valid_rate": sum(valid) / len(valid),
            "tool_match_rate": sum(match) / len(match),
            "n_sites": float(len(scores)),
            "answers": answers,
            "per_site": {"valid_rate": valid, "tool_match_rate": match},
        }

    @torch.no_grad()
    def _pref(self, model: Any) -> dict[str, float]:
        from composer_replication.loss import sequence_logprobs
        from composer_replication.trainer import pair_tokens

        dev = next(model.parameters()).device
        wins = 0
        for i in range(0, len(self.pairs), self.batch_size):
            enc = pair_tokens.encode_pairs(self.tok, self.pairs[i : i + self.batch_size], self.max_len)
            avg = {}
            for side in ("chosen", "rejected"):
                ids, mask = enc[f"dpo_{side}_input_ids"].to(dev), enc[f"dpo_{side}_response_mask"].to(dev)
                avg[side] = sequence_logprobs(model, ids, mask, average=True).float().cpu()
            wins += int((avg["chosen"] > avg["rejected"]).sum())
        return {"pref_accuracy": wins / len(self.pairs), "n_pairs": float(len(self.pairs))}

    def measure(self, model: Any, *, greedy: bool = True) -> dict[str, Any]:
        """All metrics for ``model`` (``answers`` holds the greedy answers, in site order)."""
        was_training = model.training
        model.eval()
        try:
            out: dict[str, Any] = self._ce_jsd(model)
            if greedy:
                actions = self._actions(model)
                per_site = {**out["per_site"], **actions.pop("per_site")}
                out.update(actions, per_site=per_site)
            if self.pairs:
                out.update(self._pref(model))
        finally:
            model.train(was_training)
        return out


def _pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    return pad_rows(seqs, pad), pad_rows([[1] * len(s) for s in seqs], 0)
