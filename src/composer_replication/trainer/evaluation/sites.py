"""Held-out measurements at tool-error sites of whole sessions the model never trained on.

A site (``trainer.error_sites.error_sites`` of held-out traces) is the history up to a failed tool result, the hint
for that failure and the recorded recovery (what the agent did next). :class:`SiteSet` tokenises the
sites once; :meth:`SiteSet.measure` scores one model:

- ``recovery_ce``: cross-entropy of the recorded recovery's tokens given the history (no hint): the mean
  over the site's tokens, then over sites (every site counts once, however long its recovery).
- ``hinted_jsd``: generalized JSD (beta 0.5) between the model without the hint and the same model given
  the hint, on the same recovery tokens (mean over tokens, then sites): how much of the hint the model
  has absorbed. The teacher's prompt is the student's plus the hint (``trainer.error_sites.site_prompts``): the
  hint never costs it history. Only at sites with a hint (``n_hinted_sites``; a rejected tool call has none).
- ``valid_rate`` / ``tool_match_rate``: the greedy answer at the site, scored by ``wire.score_action``:
  a valid action (it ended before ``max_new_tokens`` and is well-formed); and a valid action calling the
  same tools as the recorded recovery. ``truncated_rate`` is the share of answers cut by
  ``max_new_tokens`` before an end-of-turn token: none of them is valid, prose or call (at this model
  size they are repetition loops; a budget that is too small reads as invalid actions).
  ``well_formed_rate`` counts well-formed answers whether they ended or not (a cut prose answer parses;
  a cut call does not). ``tool_call_rate`` is the share of valid answers holding a tool call (a prose
  answer is a valid action without one).
- ``teacher_recovery_ce``: the recovery CE of the hinted teacher itself (the same model given the
  hint), at the hinted sites: how much the hint helps this model predict the recovery, i.e. what the
  SDPO channel can pass on at best.
- ``pref_accuracy``: over held-out recovery pairs (``trainer.data.recovery_pairs``: the recovery chosen,
  the failed action rejected), the fraction whose chosen response has the higher mean token log-prob.

Every quantity is a mean over sites (or pairs) with its count in ``n_*``, and ``per_site`` holds the
per-site values (for paired before/after comparisons). Nothing is sampled: one model gives one number
per metric, and the spread across models comes from training seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from composer_replication import encoding, wire
from composer_replication.trainer.error_sites import ErrorSite, site_messages, site_prompts, site_tools
from composer_replication.trainer.evaluation.frozen_prefix import FrozenPrefix

METRICS = ("recovery_ce", "hinted_jsd", "valid_rate", "tool_match_rate", "pref_accuracy")


@dataclass
class _Row:
    site: ErrorSite
    prompt: list[int]  # history + generation prompt (greedy answers start here too)
    hinted: list[int] | None  # the hinted history + generation prompt (None: the site has no hint)
    rec: list[int]  # the recorded recovery's tokens (capped)
    tools: list[str] = field(default_factory=list)


@dataclass
class _Pair:
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


def recovery_ids(tok: Any, messages: list[dict], recovery: str, tools: list[dict] | None = None) -> list[int]:
    """The tokens the chat template adds for the assistant turn ``recovery`` after ``messages``
    (``wire``: its tool calls in the active format, the session's ``tools`` shown)."""
    head = wire.render(tok, messages, tools)
    full = wire.render(tok, [*messages, wire.assistant_message(recovery)], tools, add_generation_prompt=False)
    if not full.startswith(head):
        raise ValueError("the chat template does not render the assistant turn after its header")
    return list(tok(full[len(head) :], add_special_tokens=False)["input_ids"])


class SiteSet:
    """Held-out error sites (and recovery pairs), tokenised once for :meth:`measure`.

    ``max_len`` caps each scored row, prompt plus response (history cut from the left); ``max_recovery``
    caps the recovery (and pair response) tokens scored; ``max_new_tokens`` is the greedy answer length;
    ``tools_by_trace`` gives each session's tool names (an answer naming another tool is not valid).
    Each prompt runs through the model once (``generation.engine.prefill``): the recovery is scored from
    a copy of its KV cache and the greedy answer decodes from it, so a site costs one history forward (two
    with a hint), and a pair one.
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
        from composer_replication.trainer import pair_tokens

        if not sites:
            raise ValueError("no held-out error sites: the evaluation sessions hold no failed tool call")
        self.tok, self.pairs, self.max_len = tok, list(pairs), max_len
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self.pad = encoding.pad_id(tok)
        self._prefix: FrozenPrefix | None = None
        self._progress: Callable[[str], None] | None = None
        self.rows: list[_Row] = []
        for s in sites:
            msgs = site_messages(s, hinted=False)
            rec = recovery_ids(tok, msgs, s.recovery, site_tools(s))[:max_recovery]
            student, hinted = site_prompts(tok, s, max(8, max_len - len(rec)))  # teacher: + the hint
            tools = list((tools_by_trace or {}).get(s.site_id.rsplit("::", 1)[0], []))
            self.rows.append(_Row(s, student, hinted, rec, tools))
        eos = tok.eos_token or ""
        self.pair_rows: list[_Pair] = []
        for p in self.pairs:
            _, messages, chosen, rejected = pair_tokens.pair_fields(p)
            ptools = pair_tokens.pair_tools(p)
            c, r = (
                list(tok(wire.response_text(tok, t, ptools) + eos, add_special_tokens=False)["input_ids"])[
                    :max_recovery
                ]
                for t in (chosen, rejected)
            )
            prompt = encoding.render_prompt_ids(tok, messages, ptools)[
                -max(8, max_len - max(len(c), len(r))) :
            ]
            self.pair_rows.append(_Pair(prompt, c, r))

    def __len__(self) -> int:
        return len(self.rows)

    @contextmanager
    def _shared(self, key: str) -> Iterator[None]:
        with self._prefix.call(key) if self._prefix is not None else nullcontext():
            yield
        self._done(key)

    def _done(self, stage: str) -> None:
        if self._progress is not None:
            self._progress(stage)

    def stages(self, greedy: bool = True) -> int:
        """How many stages :meth:`measure` reports to ``progress`` (forwards and decodes, per chunk)."""
        chunks = self._chunks(self.rows)
        hinted = sum(any(r.hinted is not None for r in c) for c in chunks)
        return len(chunks) * (2 + greedy) + 2 * hinted + 3 * len(self._chunks(self.pair_rows))

    def _chunks(self, items: list) -> list[list]:
        return [items[i : i + self.batch_size] for i in range(0, len(items), self.batch_size)]

    @torch.no_grad()
    def _sites(self, model: Any, greedy: bool) -> dict[str, Any]:
        from composer_replication.generation.engine import continuation_logits, decode, eos_token_ids, prefill
        from composer_replication.loss import token_logprobs
        from composer_replication.opsd import generalized_jsd_loss

        dev = next(model.parameters()).device
        eos = eos_token_ids(self.tok)
        ce, jsd, t_ce, answers, n = [], [], [], [], 0
        cut: list[float] = []
        for c, chunk in enumerate(self._chunks(self.rows)):
            recs = [r.rec for r in chunk]
            with self._shared(f"site{c}/prompt"):
                pre = prefill(model, [r.prompt for r in chunk], self.pad)
            with self._shared(f"site{c}/recovery"):
                s_log = continuation_logits(model, pre, recs, self.pad)
            hinted = [k for k, r in enumerate(chunk) if r.hinted is not None]
            if hinted:
                with self._shared(f"site{c}/hinted"):
                    pre_t = prefill(model, [chunk[k].hinted for k in hinted], self.pad)
                with self._shared(f"site{c}/hinted_recovery"):
                    t_log = continuation_logits(model, pre_t, [recs[k] for k in hinted], self.pad)
            for b, r in enumerate(chunk):
                rows = s_log[b, : len(r.rec)]
                labels = torch.tensor(r.rec, device=dev)
                ce.append(-float(token_logprobs(rows[None], labels[None]).mean()))
                n += len(r.rec)
                if b in hinted:
                    t_rows = t_log[hinted.index(b), : len(r.rec)]
                    jsd.append(float(generalized_jsd_loss(rows[None], t_rows[None], beta=0.5)))
                    t_ce.append(-float(token_logprobs(t_rows[None], labels[None]).mean()))
            if greedy:
                ids = decode(model, pre, max_new_tokens=self.max_new_tokens, temperature=0, eos_ids=eos)
                self._done(f"site{c}/greedy")
                answers += [self.tok.decode(x, skip_special_tokens=True) for x in ids]
                cut += [float(len(x) >= self.max_new_tokens and x[-1] not in eos) for x in ids]
        out: dict[str, Any] = {
            "recovery_ce": sum(ce) / len(ce),
            "hinted_jsd": sum(jsd) / len(jsd) if jsd else None,
            "teacher_recovery_ce": sum(t_ce) / len(t_ce) if t_ce else None,
            "n_recovery_tokens": float(n),
            "n_hinted_sites": float(len(jsd)),
            "per_site": {"recovery_ce": ce, "hinted_jsd": jsd, "teacher_recovery_ce": t_ce},
        }
        if greedy:
            out.update(self._score(answers, [not c for c in cut]))
            out["truncated_rate"] = sum(cut) / len(cut)
        return out

    def _score(self, answers: list[str], complete: list[bool]) -> dict[str, Any]:
        from composer_replication.wire import score_action

        scores = [
            score_action(a, {"student_action": r.site.recovery, "tools": r.tools}, complete=c)
            for a, r, c in zip(answers, self.rows, complete, strict=True)
        ]
        valid = [float(s["valid"]) for s in scores]
        match = [float(s["tool_match"]) for s in scores]
        calls = [float(s["has_tool_call"]) for s in scores]
        formed = [float(s["well_formed"]) for s in scores]
        return {
            "valid_rate": sum(valid) / len(valid),
            "tool_match_rate": sum(match) / len(match),
            "tool_call_rate": sum(calls) / len(calls),
            "well_formed_rate": sum(formed) / len(formed),
            "n_sites": float(len(scores)),
            "answers": answers,
            "per_site_actions": {"valid_rate": valid, "tool_match_rate": match},
        }

    @torch.no_grad()
    def _pref(self, model: Any) -> dict[str, float]:
        from composer_replication.generation.engine import continuation_logits, prefill
        from composer_replication.loss import token_logprobs

        dev = next(model.parameters()).device
        wins = 0
        for c, chunk in enumerate(self._chunks(self.pair_rows)):
            with self._shared(f"pair{c}/prompt"):
                pre = prefill(model, [p.prompt for p in chunk], self.pad)
            avg = {}
            for side in ("chosen", "rejected"):
                resp = [getattr(p, side) for p in chunk]
                with self._shared(f"pair{c}/{side}"):
                    logits = continuation_logits(model, pre, resp, self.pad)
                avg[side] = [
                    float(token_logprobs(logits[b, : len(x)][None], torch.tensor([x], device=dev)).mean())
                    for b, x in enumerate(resp)
                ]
            wins += sum(c > r for c, r in zip(avg["chosen"], avg["rejected"], strict=True))
        return {"pref_accuracy": wins / len(self.pair_rows), "n_pairs": float(len(self.pair_rows))}

    def measure(
        self,
        model: Any,
        *,
        greedy: bool = True,
        shared_layers: int = 0,
        progress: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """All metrics for ``model`` (``answers`` holds the greedy answers, in site order).

        ``shared_layers`` (n > 0): the models measured with this set share their first n decoder layers
        and embeddings (adapters on later layers only): what those layers compute for the fixed prompts
        and recoveries is recorded at the first model and replayed at the next ones whose weights there
        are byte-equal (``trainer.evaluation.frozen_prefix``; same numbers, ~n/L of the prefill work saved), the
        greedy answers are decoded in full. Any other model is measured in full. ``progress`` is called
        with each stage's name as it ends (:meth:`stages` of them: a progress bar's updates)."""
        if shared_layers and (self._prefix is None or self._prefix.n != shared_layers):
            self._prefix = FrozenPrefix(shared_layers)
        elif not shared_layers:
            self._prefix = None
        was_training = model.training
        model.eval()
        bound = self._prefix.bind(model, weights_fixed=True) if self._prefix is not None else nullcontext()
        self._progress = progress
        try:
            with bound:
                out: dict[str, Any] = self._sites(model, greedy)
                if greedy:
                    out["per_site"].update(out.pop("per_site_actions"))
                if self.pair_rows:
                    out.update(self._pref(model))
        finally:
            model.train(was_training)
            self._progress = None
        return out

    def greedy_answers(self, model: Any) -> list[str]:
        """The model's greedy answer at every site (batched, KV cache)."""
        return self.measure(model)["answers"]
