"""Rendering: messages and tool schemas into prompt text and token ids through the tokenizer's chat
template, in the active format (``native``: ``apply_chat_template(messages, tools=...)``, a Hermes
template supplied where the tokenizer's has no tool support; ``text``: the text format's messages)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from composer_replication.wire._actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_tool_use
from composer_replication.wire._messages import assistant_message, text_messages

FORMATS = ("native", "text")
_state = {"format": os.environ.get("COMPOSER_WIRE_FORMAT", "native")}

# Hermes-style tool calling in ChatML (what Qwen2.5's template writes, with one user turn per tool result
# so that every prefix of a conversation renders as a prefix of the whole). Without tools and tool calls
# it renders exactly as plain ChatML.
HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# How a server parses what HERMES_TEMPLATE's assistant turns hold (transformers' declarative response
# template, the one it falls back to for Qwen2 models): written into an exported tokenizer, so that
# ``transformers serve`` answers with OpenAI ``tool_calls`` whatever the model's architecture.
HERMES_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


def get_format() -> str:
    """The active wire format: ``native`` (default) or ``text`` (env ``COMPOSER_WIRE_FORMAT``,
    :func:`set_format`, the train config's ``data.wire_format``)."""
    fmt = _state["format"]
    if fmt not in FORMATS:
        raise ValueError(f"COMPOSER_WIRE_FORMAT={fmt!r}: the wire format is one of {', '.join(FORMATS)}")
    return fmt


def set_format(fmt: str) -> None:
    """Set the wire format (and ``COMPOSER_WIRE_FORMAT``, so that worker processes follow)."""
    if fmt not in FORMATS:
        raise ValueError(f"wire format {fmt!r}: use one of {', '.join(FORMATS)}")
    _state["format"] = fmt
    os.environ["COMPOSER_WIRE_FORMAT"] = fmt


@contextlib.contextmanager
def use_format(fmt: str) -> Iterator[None]:
    """The wire format ``fmt`` inside the block, the previous one after it."""
    before, env = _state["format"], os.environ.get("COMPOSER_WIRE_FORMAT")
    set_format(fmt)
    try:
        yield
    finally:
        _state["format"] = before
        if env is None:
            os.environ.pop("COMPOSER_WIRE_FORMAT", None)
        else:
            os.environ["COMPOSER_WIRE_FORMAT"] = env


def example_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One tool call as a prompt shows it to the model in the active format: a text-format line, or the
    Hermes ``<tool_call>`` block the native format's templates (the project's and Qwen's) write."""
    if get_format() == "text":
        return format_tool_use(name, dict(arguments))
    body = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def _template_text(tok: Any) -> str:
    t = getattr(tok, "chat_template", None)
    return " ".join(str(v) for v in t.values()) if isinstance(t, Mapping) else str(t or "")


def supports_tools(tok: Any) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` and assistant ``tool_calls``."""
    text = _template_text(tok)
    return "tools" in text and "tool_calls" in text


def prepare_tokenizer(tok: Any) -> Any:
    """The tokenizer, ready for native tool calls: a ChatML template without tool support (SmolLM2's,
    the test tokenizers') is replaced by :data:`HERMES_TEMPLATE` (idempotent; training, evaluation,
    rollouts and the exported tokenizer all get it). A non-ChatML template without tool support is
    refused with one line."""
    if supports_tools(tok):
        return tok
    text = _template_text(tok)
    if text and "<|im_start|>" not in text:
        name = getattr(tok, "name_or_path", "") or type(tok).__name__
        raise ValueError(
            f"tokenizer {name}: its chat template has no tool support and is not ChatML; give it a "
            "template that renders tools= and tool_calls, or set the wire format to text"
        )
    tok.chat_template = HERMES_TEMPLATE
    return tok


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Stored (OpenAI) messages as chat templates take them: call ``arguments`` as objects, ``None``
    fields (as Arrow datasets hand them back) left out, ``None`` content as ""."""
    out = []
    for m in messages:
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = str(m.get("content") or "")
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _args(c["function"].get("arguments"))}}
                for c in m["tool_calls"]
            ]
        else:
            msg.pop("tool_calls", None)
        out.append(msg)
    return out


def render(
    tok: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of ``messages`` with the session's ``tools``, in the active format."""
    if not messages:
        return ""
    name = getattr(tok, "name_or_path", "") or type(tok).__name__
    try:
        if get_format() == "text":
            out = tok.apply_chat_template(text_messages(messages, tools), tokenize=False,
                                          add_generation_prompt=add_generation_prompt)  # fmt: skip
        else:
            prepare_tokenizer(tok)
            out = tok.apply_chat_template(template_messages(messages), tools=list(tools or []) or None,
                                          tokenize=False, add_generation_prompt=add_generation_prompt)  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"tokenizer {name}: the chat template failed on these messages ({e})") from e
    except Exception as e:  # jinja2's TemplateError and the template's own raise_exception
        if type(e).__module__.split(".")[0] != "jinja2":
            raise
        raise ValueError(f"tokenizer {name}: the chat template raised {type(e).__name__}: {e}") from e
    if not isinstance(out, str):
        raise ValueError(f"tokenizer {name}: apply_chat_template(tokenize=False) must return a string")
    return out


def render_ids(
    tok: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of :func:`render` (tokenised without special tokens: the template wrote them)."""
    text = render(tok, messages, tools, add_generation_prompt=add_generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"]) if text else []


_SENTINEL = "\u2063\u2063wire-sentinel\u2063\u2063"
_PROBE = [{"role": "user", "content": "."}]


def response_text(tok: Any, action: str, tools: Sequence[Any] | None = None) -> str:
    """What the model writes for ``action`` (action text or model output) as its answer, in the active
    format: the text format's action text, or the body of the native assistant turn the chat template
    renders (prose, then the template's tool-call markup), without the end-of-turn marker."""
    if get_format() == "text":
        return action
    head = render(tok, _PROBE, tools)
    full = render(tok, [*_PROBE, assistant_message(action)], tools, add_generation_prompt=False)
    probe = render(
        tok, [*_PROBE, {"role": "assistant", "content": _SENTINEL}], tools, add_generation_prompt=False
    )
    closing = probe[probe.find(_SENTINEL) + len(_SENTINEL) :]
    if not full.startswith(head):
        raise ValueError("the chat template does not render the generation prompt as a prefix of the answer")
    body = full[len(head) :]
    return body[: len(body) - len(closing)] if closing and body.endswith(closing) else body


def fit_messages(
    tok: Any, messages: Sequence[Mapping[str, Any]], max_len: int, tools: Sequence[Any] | None = None
) -> list[dict[str, Any]]:
    """Drop the oldest messages (a leading system message stays; tool results left without their call
    go with it) until the prompt (with the generation prompt and ``tools``) fits ``max_len`` tokens; a
    last message still over the cap keeps the end of its text.

    Used for every prompt a model answers (GRPO rows, evaluation), like the collator's truncation of
    training rows: whole messages go first, the system message never.
    """
    msgs = [dict(m) for m in messages]
    if len(render_ids(tok, msgs, tools)) <= max_len:
        return msgs
    keep_first = 1 if msgs and msgs[0].get("role") == "system" else 0
    # Estimate from per-message token counts (one tokenizer call each), then verify by rendering:
    # re-rendering the whole history per dropped message is quadratic on long agent sessions.
    fixed = len(render_ids(tok, msgs[:keep_first], tools, add_generation_prompt=False)) if keep_first else 0
    sizes = [_estimate(tok, m) for m in msgs]
    budget, start = max_len - fixed, len(msgs)
    while start > keep_first and budget - sizes[start - 1] >= 0:
        start -= 1
        budget -= sizes[start]
    msgs = msgs[:keep_first] + msgs[min(start, len(msgs) - 1) :]
    _drop_orphans(msgs, keep_first)
    while len(render_ids(tok, msgs, tools)) > max_len and len(msgs) > keep_first + 1:
        del msgs[keep_first]
        _drop_orphans(msgs, keep_first)
    while len(render_ids(tok, msgs, tools)) > max_len and len(msgs[-1]["content"]) > 16:
        msgs[-1]["content"] = msgs[-1]["content"][len(msgs[-1]["content"]) // 4 :]
    return msgs


def _estimate(tok: Any, m: Mapping[str, Any]) -> int:
    text = str(m.get("content") or "") + json.dumps(m.get("tool_calls") or "", ensure_ascii=False)
    return len(tok(text, add_special_tokens=False)["input_ids"]) + 8


def _drop_orphans(msgs: list[dict[str, Any]], at: int) -> None:
    """Tool results at ``at`` whose call was dropped go too (the last message always stays)."""
    while len(msgs) > at + 1 and msgs[at].get("role") == "tool":
        del msgs[at]
