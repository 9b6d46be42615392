"""``ComposerDataCollator``: traces (+ optional DPO pairs) -> trainer-ready tensors for the three channels.

Rendering: a trace becomes chat messages through :mod:`composer_replication.wire` (the one rendering
shared with states, GRPO prompts and evaluation: assistant ``tool_calls``, ``tool`` results, the SDPO
hint appended to the message carrying the error), then every sequence is rendered with the tokenizer's
chat template and the trace's tool schemas (``wire.render``, in the active wire format). Token ids are built per message
(the text each message adds to the rendered prefix), and an assistant message is split into its header (the
generation prompt) and its body (content + end-of-turn tokens). Masks are therefore exact by construction.
Truncation (rows never exceed the cap) drops messages after the last response first (they have no target),
then the oldest messages (a leading system message stays), then the oldest tokens of the prompt in front of
the protected response (never the SDPO hint), then the system message; the header just before a response
is never cut, so no response token sits at position 0. If the protected response is by itself longer than the cap, its tail is cut (its first tokens
are kept, as in TRL's SFT truncation). ``ignore_index`` is kept for API compatibility: masks are 0/1 tensors.

Channels and their keys (present exactly under these conditions):

* 1 (always): ``input_ids``, ``attention_mask``, ``response_mask`` (all kept assistant bodies), ``rewards``.
* 2 (``enable_sdpo`` and ``hint_generator`` set and at least one example has an error site — a tool turn with
  ``tool_error`` followed by an assistant turn that survives truncation — for which the generator returns a
  hint; the last such site of an example is used):
  ``ctx_teacher_input_ids`` (the same history, cut after the recovery turn, with the hint appended to the
  message that carries the error), ``sdpo_loss_mask`` (the recovery turn's body in the teacher sequence) and
  ``sdpo_student_mask`` (the same tokens in ``input_ids``; both masks select identical token ids in order).
* 3 (``enable_replay_dpo`` and at least one ``dpo_pairs`` entry in the batch): ``dpo_chosen_input_ids``,
  ``dpo_chosen_response_mask``, ``dpo_rejected_input_ids``, ``dpo_rejected_response_mask``; one row per
  pair, so the DPO batch size can differ from the student batch size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, cast

import torch

from composer_replication import wire
from composer_replication.encoding import pad_rows
from composer_replication.wire import turns_to_messages

__all__ = [
    "CollatorConfig",
    "ComposerDataCollator",
    "TokenizerLike",
    "TraceExample",
    "TraceTurn",
    "turns_to_messages",  # re-exported from wire
]


class TraceTurn(TypedDict, total=False):
    role: str  # "user" | "assistant" | "tool"
    content: str
    tool_call: dict | None
    tool_error: str | None
    error_meta: dict


class TraceExample(TypedDict, total=False):
    trace_id: str
    turns: list[TraceTurn]
    final_reward: float
    dpo_pairs: list[dict] | None
    tools: list[str]  # the session's tool names (``wire.trace_tools``)
    tool_schemas: list[dict]  # their schemas, rendered with every row (``wire.trace_tool_schemas``)


class TokenizerLike(Protocol):
    """What the collator needs from a tokenizer (HF tokenizers qualify)."""

    pad_token_id: int

    def __call__(self, text: str | list[str], **kwargs: Any) -> dict[str, list]: ...

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> str | list[int]: ...


@dataclass
class CollatorConfig:
    max_seq_len: int = 4096
    max_dpo_seq_len: int = 2048
    pad_token_id: int = 0
    ignore_index: int = -100
    enable_sdpo: bool = True
    hint_generator: Callable[[str, dict], str | None] | None = None
    enable_replay_dpo: bool = True
    rlvr_reward_key: str = "final_reward"
    # None: ``wire.SYSTEM_PROMPT`` (what states, GRPO prompts and evaluation show);
    # a string replaces it, "" means no system message. DPO state_messages carry their own.
    system_prompt: str | None = None
    # True: a row ends at its last response that fits whole under ``max_seq_len`` (later messages are left
    # out), so no target is an action cut before its end; a response longer than the cap is still trained
    # (its first tokens) when no earlier one fits. False: the last response is the target, cut if too long.
    whole_responses: bool = False

    def __post_init__(self) -> None:
        if self.max_seq_len < 8 or self.max_dpo_seq_len < 8:
            raise ValueError("CollatorConfig: max_seq_len and max_dpo_seq_len must be >= 8")


_SENTINEL = "\u2063\u2063collator-sentinel\u2063\u2063"


@dataclass
class _Piece:
    ids: list[int]
    is_response: bool
    msg: int  # message index (header and body of one assistant message share it)


def _end_at_whole_response(
    msgs: list[dict], pieces: list[_Piece], assistant: set[int], max_len: int
) -> tuple[list[dict], list[_Piece], set[int]]:
    """Cut the conversation after its last assistant message whose header and body fit in ``max_len``
    (unchanged when the last one fits, or when none does)."""
    size: dict[int, int] = {}
    for p in pieces:
        if p.msg in assistant:
            size[p.msg] = size.get(p.msg, 0) + len(p.ids)
    fits = [i for i in sorted(assistant) if size.get(i, 0) <= max_len]
    if not fits or fits[-1] == max(assistant):
        return msgs, pieces, assistant
    end = fits[-1]
    return msgs[: end + 1], [p for p in pieces if p.msg <= end], {i for i in assistant if i <= end}


@dataclass
class ComposerDataCollator:
    tokenizer: TokenizerLike
    config: CollatorConfig = field(default_factory=CollatorConfig)

    # -- rendering -----------------------------------------------------------------------------------------

    def _render(self, msgs: list[dict], gen: bool, tools: list[dict] | None = None) -> str:
        return wire.render(self.tokenizer, msgs, tools, add_generation_prompt=gen)

    def _added_tokens(self, plain: list[dict], hinted: list[dict], tools: list[dict] | None) -> int:
        """Tokens the hint adds at the end of the rendered history (where the two renders part, to the end)."""
        a, b = self._render(plain, False, tools), self._render(hinted, False, tools)
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return len(self.tokenizer(b[n:], add_special_tokens=False)["input_ids"])

    def _pieces(self, msgs: list[dict], tools: list[dict] | None = None) -> list[_Piece]:
        texts: list[tuple[str, bool, int]] = []
        prev = ""
        # a run of tool results is one piece: templates may group them (Qwen2.5's does); the text format
        # merges every run of user and tool messages into one user message (`wire.text_messages`)
        run = ("tool",) if wire.get_format() == "native" else wire.TEXT_MERGED_ROLES
        for i, m in enumerate(msgs):
            if m["role"] in run and i + 1 < len(msgs) and msgs[i + 1]["role"] in run:
                continue
            if m["role"] == "assistant":
                if i:
                    head = self._render(msgs[:i], True, tools)
                else:  # templates cannot render an empty conversation: find the header with a sentinel
                    probe = self._render([{**m, "content": _SENTINEL}], False, tools)
                    head = probe[: max(probe.find(_SENTINEL), 0)]
                full = self._render(msgs[: i + 1], False, tools)
                if not head.startswith(prev) or not full.startswith(head):
                    raise ValueError(
                        "the tokenizer's chat template does not render conversations prefix-consistently "
                        f"(message {i}); use a template where rendering msgs[:k] is a prefix of msgs[:k+1]"
                    )
                texts += [(head[len(prev) :], False, i), (full[len(head) :], True, i)]
            else:
                full = self._render(msgs[: i + 1], False, tools)
                if not full.startswith(prev):
                    raise ValueError(f"chat template is not prefix-consistent at message {i}")
                texts.append((full[len(prev) :], False, i))
            prev = full
        texts = [t for t in texts if t[0]]
        if not texts:
            return []
        enc = self.tokenizer([t[0] for t in texts], add_special_tokens=False)["input_ids"]
        return [_Piece(list(ids), r, i) for ids, (_, r, i) in zip(enc, texts, strict=True)]

    @staticmethod
    def _truncate(
        pieces: list[_Piece],
        protect_from: int,
        max_len: int,
        keep_first: bool,
        trim_from: int,
        keep_tail: tuple[int, int] = (-1, 0),
    ) -> list[_Piece]:
        """Drop whole messages from the oldest (a leading system message stays) until ``max_len`` fits;
        messages with index >= ``protect_from`` are never dropped, nor those >= ``trim_from`` shortened.
        ``keep_tail = (message, n)``: trimming that message keeps its last ``n`` tokens (the hint)."""
        total = sum(len(p.ids) for p in pieces)
        if total <= max_len:
            return pieces
        # Messages after the last response carry no target (e.g. a trailing tool result): they go first.
        last_resp = max((p.msg for p in pieces if p.is_response), default=-1)
        if any(p.msg > last_resp for p in pieces):
            pieces = [p for p in pieces if p.msg <= last_resp]
            total = sum(len(p.ids) for p in pieces)
            if total <= max_len:
                return pieces
        order = sorted({p.msg for p in pieces})
        drop: set[int] = set()
        for mi in order[1 if keep_first else 0 :]:
            if total <= max_len or mi >= protect_from:
                break
            drop.add(mi)
            total -= sum(len(p.ids) for p in pieces if p.msg == mi)
        kept = [p for p in pieces if p.msg not in drop]

        # Still too long: cut the oldest tokens of the prompt in front of the first kept response (never a
        # response, never the protected response's own header, so that a response token is never at
        # position 0 where no logit predicts it); first sparing the hint (``keep_tail``) and the system
        # message, then (the system message gone: it is the same text in every row) the hint too.
        def trim(start: int, spare: int) -> int:
            n = total
            for p in kept[start:]:
                if n <= max_len or p.is_response or p.msg >= trim_from:
                    break
                cut = min(n - max_len, len(p.ids) - (spare if p.msg == keep_tail[0] else 0))
                if cut > 0:
                    p.ids = p.ids[cut:]
                    n -= cut
            return n

        total = trim(1 if keep_first else 0, keep_tail[1])
        if total > max_len and keep_first and kept and kept[0].msg == 0 and not kept[0].is_response:
            total -= len(kept[0].ids)
            kept = kept[1:]
            total = trim(0, 0)
        # Still too long: the protected response alone exceeds the cap. Keep its first tokens (as TRL's
        # SFT truncation does); a row never exceeds ``max_len``.
        for p in reversed(kept):
            if total <= max_len:
                break
            cut = min(total - max_len, len(p.ids))
            p.ids = p.ids[: len(p.ids) - cut]
            total -= cut
        return [p for p in kept if p.ids]

    def _encode(
        self,
        msgs: list[dict],
        response_msgs: set[int],
        protect_from: int,
        max_len: int,
        trim_from: int | None = None,
        keep_tail: tuple[int, int] = (-1, 0),
        pieces: list[_Piece] | None = None,
        tools: list[dict] | None = None,
    ) -> tuple[list[int], list[int], dict[int, tuple[int, int]]]:
        keep_first = bool(msgs) and msgs[0]["role"] == "system"
        trim = protect_from if trim_from is None else trim_from
        pieces = self._pieces(msgs, tools) if pieces is None else pieces
        pieces = self._truncate(pieces, protect_from, max_len, keep_first, trim, keep_tail)
        ids: list[int] = []
        mask: list[int] = []
        spans: dict[int, tuple[int, int]] = {}
        for p in pieces:
            on = 1 if (p.is_response and p.msg in response_msgs) else 0
            if p.is_response:
                spans[p.msg] = (len(ids), len(ids) + len(p.ids))
            ids.extend(p.ids)
            mask.extend([on] * len(p.ids))
        return ids, mask, spans

    # -- batch -----------------------------------------------------------------------------------------------

    def __call__(self, batch: Sequence[TraceExample]) -> dict[str, torch.Tensor]:
        cfg = self.config
        rows_ids, rows_mask, rewards = [], [], []
        t_ids: list[list[int]] = []
        t_mask: list[list[int]] = []
        s_mask: list[list[int]] = []
        any_sdpo = False
        for ex in batch:
            turns = list(ex.get("turns") or [])
            msgs, where = wire.trace_messages(ex, system_prompt=cfg.system_prompt)
            tools = wire.trace_tool_schemas(ex)
            assistant = {i for i, m in enumerate(msgs) if m["role"] == "assistant"}
            pieces = self._pieces(msgs, tools)
            if cfg.whole_responses:
                msgs, pieces, assistant = _end_at_whole_response(msgs, pieces, assistant, cfg.max_seq_len)
            last = max(assistant) if assistant else len(msgs)
            ids, mask, spans = self._encode(msgs, assistant, last, cfg.max_seq_len, pieces=pieces)
            rows_ids.append(ids)
            rows_mask.append(mask)
            r = cast("Mapping[str, Any]", ex).get(cfg.rlvr_reward_key)
            rewards.append(float(r) if r is not None else 0.0)
            site = (
                self._error_site(turns, where, msgs, spans)
                if cfg.enable_sdpo and cfg.hint_generator
                else None
            )
            if site is None:
                t_ids.append([])
                t_mask.append([])
                s_mask.append([0] * len(ids))
                continue
            rec, hint = site
            hinted = wire.add_hint(msgs[:rec], hint)  # the hint may be a message of its own
            tmsgs, trec = [*hinted, dict(msgs[rec])], len(hinted)
            # The hint (and the end of its message) survives truncation: without it there is no teacher.
            n_hint = self._added_tokens(msgs[:rec], hinted, tools)
            tids, tmask, tspans = self._encode(
                tmsgs,
                {trec},
                trec - 1,
                cfg.max_seq_len,
                trim_from=trec,
                keep_tail=(trec - 1, n_hint),
                tools=tools,
            )
            a, b = spans[rec]
            # A recovery turn cut at the cap may be cut at a different length in the two rows (the hint
            # makes the teacher's longer): both masks keep the same leading tokens.
            ta, tb = tspans.get(trec, (0, 0))
            n = min(b - a, tb - ta)
            if n <= 0:
                t_ids.append([])
                t_mask.append([])
                s_mask.append([0] * len(ids))
                continue
            any_sdpo = True
            t_ids.append(tids)
            t_mask.append([1 if ta <= k < ta + n else 0 for k in range(len(tids))])
            s_mask.append([1 if a <= k < a + n else 0 for k in range(len(ids))])
        out = {
            "input_ids": pad_rows(rows_ids, cfg.pad_token_id),
            "attention_mask": pad_rows([[1] * len(x) for x in rows_ids], 0),
            "response_mask": pad_rows(rows_mask, 0),
            "rewards": torch.tensor(rewards, dtype=torch.float32),
        }
        if any_sdpo:
            out["ctx_teacher_input_ids"] = pad_rows(t_ids, cfg.pad_token_id)
            out["sdpo_loss_mask"] = pad_rows(t_mask, 0)
            out["sdpo_student_mask"] = pad_rows(s_mask, 0)
        pairs = [p for ex in batch for p in (ex.get("dpo_pairs") or [])] if cfg.enable_replay_dpo else []
        if pairs:
            for side in ("chosen", "rejected"):
                seqs = [self._dpo_row(p, side) for p in pairs]
                out[f"dpo_{side}_input_ids"] = pad_rows([s[0] for s in seqs], cfg.pad_token_id)
                out[f"dpo_{side}_response_mask"] = pad_rows([s[1] for s in seqs], 0)
        return out

    def _error_site(
        self,
        turns: Sequence[Mapping[str, Any]],
        where: list[int],
        msgs: list[dict],
        spans: dict[int, tuple[int, int]],
    ) -> tuple[int, str] | None:
        """The last error site whose recovery turn survived truncation and has a hint: (recovery msg, hint)."""
        gen = self.config.hint_generator
        assert gen is not None
        for i in range(len(turns) - 1, -1, -1):
            t = turns[i]
            if t.get("role") != "tool" or t.get("tool_error") is None:
                continue
            j = next((k for k in range(i + 1, len(turns)) if turns[k].get("role") == "assistant"), None)
            if j is None or where[j] not in spans:
                continue
            meta = dict(t.get("error_meta") or {})
            meta.setdefault("error_message", t.get("tool_error"))
            hint = gen(str(meta.get("error_kind") or "runtime_error"), meta)
            if hint:
                return where[j], hint
        return None

    def _dpo_row(self, pair: dict[str, Any], side: str) -> tuple[list[int], list[int]]:
        """The pair's state and one side's action as the assistant turn (``wire.assistant_message``),
        rendered with the pair's ``tools`` when it carries them."""
        msgs = [dict(m) for m in pair.get("state_messages") or []]
        msgs.append(wire.assistant_message(str(pair[side])))
        resp = len(msgs) - 1
        ids, mask, _ = self._encode(msgs, {resp}, resp, self.config.max_dpo_seq_len, tools=pair.get("tools"))
        return ids, mask
