"""The one wire format: how a coding-agent trace is shown to a model and how its answers are read.

Every path that shows a trace to a model renders it here, so that the model is trained in exactly the
context it is evaluated, rolled out and served in: ingestion (the ``messages`` of states), the offline
collator, GRPO prompts (trace rows and sandbox task rows), on-policy SDPO, teacher replay, evaluation
and sandbox rollouts.

**Messages** are OpenAI-style chat messages (:mod:`._messages`):

* **System**: :data:`SYSTEM_PROMPT`. The session's tools are not in the text: they are OpenAI
  function-tool schemas (:mod:`composer_replication.tool_schemas`; ``tool_schemas`` of a state or
  trace, :func:`trace_tool_schemas`) handed to every render.
* **Action** (an assistant turn): ``{"role": "assistant", "content": <prose>, "tool_calls": [{"id",
  "type": "function", "function": {"name", "arguments": <JSON text>}}]}`` (:func:`assistant_message`).
  Thinking is not shown.
* **Tool result**: ``{"role": "tool", "tool_call_id", "name", "content", "is_error"}``: the error flag
  is kept (``openai_messages`` drops it for an API or a dataset). User-side text turns in a row merge
  into one user message, separated by a blank line.
* **Hint** (the SDPO teacher's context): ``[HINT] <text>`` right after the failure, before the answer:
  appended after a blank line to the last message when it is user text, else a user message of its own
  after the failed ``tool`` result (:func:`add_hint`).

**Rendering** (:mod:`._render`) goes through the tokenizer's chat template in the active format
(:func:`get_format`, one switch: env ``COMPOSER_WIRE_FORMAT``, :func:`set_format`, the train config's
``data.wire_format``):

* ``native`` (default): ``apply_chat_template(messages, tools=schemas)``. A ChatML template without
  tool support (SmolLM2's, the test tokenizers') gets :data:`HERMES_TEMPLATE` (:func:`prepare_tokenizer`):
  tools listed in the system turn as Qwen2.5 does, calls as ``<tool_call>{"name": ..., "arguments":
  ...}</tool_call>`` in the assistant turn, results as ``<tool_response>`` user turns. The exported
  tokenizer carries it, so a server renders and parses the same way.
* ``text``: the project's earlier format (:func:`text_messages`): the action format and the tools
  spelled out in the system message (:data:`TEXT_SYSTEM_PROMPT`, :func:`system_text`), one line
  ``[TOOL_USE] name=<tool> input=<json>`` per call, results as ``[TOOL_RESULT name=<tool>
  is_error=<true|false>]`` user text.

**Actions** (:mod:`._actions`): the project's action text (``student_action``, teacher responses) keeps
the text format's tool lines. :func:`parse_action` reads either format (Hermes ``<tool_call>`` JSON, a
code fence or a missing closing tag tolerated; text-format lines), :func:`parse_openai_message` a
server's ``tool_calls``: the same :class:`ParsedAction` whatever produced the answer. A malformed call
(arguments not a JSON object, an empty name, more than :data:`MAX_TOOL_CALLS` calls) is one line in
``errors``: the answer is malformed, never agrees with anything, and a sandbox answers it with a tool
error. Two actions agree iff their canonical forms are equal (:func:`canonical_action`).
"""

from __future__ import annotations

from composer_replication.wire._actions import (
    ACTION_FORMAT,
    ACTION_SEP,
    MAX_TOOL_CALLS,
    THINKING_TAG,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_USE_TAG,
    CanonicalAction,
    ParsedAction,
    action_text,
    canonical_action,
    format_thinking,
    format_tool_result,
    format_tool_use,
    parse_action,
    parse_openai_message,
    parse_tool_result_head,
    render_canonical,
    score_action,
    tool_calls,
)
from composer_replication.wire._messages import (
    HINT_PREFIX,
    SOLUTION_PREFIX,
    SYSTEM_PROMPT,
    TEXT_MERGED_ROLES,
    TEXT_SYSTEM_PROMPT,
    add_hint,
    append_turn,
    assistant_message,
    openai_messages,
    openai_tool_call,
    system_text,
    task_messages,
    task_text,
    text_messages,
    tool_message,
    trace_messages,
    trace_tool_schemas,
    trace_tools,
    turns_to_messages,
    with_hint,
    with_solution,
)
from composer_replication.wire._render import (
    FORMATS,
    HERMES_RESPONSE_TEMPLATE,
    HERMES_TEMPLATE,
    example_call,
    fit_messages,
    get_format,
    prepare_tokenizer,
    render,
    render_ids,
    response_text,
    set_format,
    supports_tools,
    template_messages,
    use_format,
)

__all__ = [
    "ACTION_FORMAT",
    "ACTION_SEP",
    "FORMATS",
    "HERMES_RESPONSE_TEMPLATE",
    "HERMES_TEMPLATE",
    "HINT_PREFIX",
    "MAX_TOOL_CALLS",
    "SOLUTION_PREFIX",
    "SYSTEM_PROMPT",
    "TEXT_MERGED_ROLES",
    "TEXT_SYSTEM_PROMPT",
    "THINKING_TAG",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_USE_TAG",
    "CanonicalAction",
    "ParsedAction",
    "action_text",
    "add_hint",
    "append_turn",
    "assistant_message",
    "canonical_action",
    "fit_messages",
    "format_thinking",
    "format_tool_result",
    "format_tool_use",
    "get_format",
    "openai_messages",
    "openai_tool_call",
    "parse_action",
    "parse_openai_message",
    "parse_tool_result_head",
    "prepare_tokenizer",
    "render",
    "render_canonical",
    "render_ids",
    "example_call",
    "response_text",
    "score_action",
    "set_format",
    "supports_tools",
    "system_text",
    "task_messages",
    "task_text",
    "template_messages",
    "text_messages",
    "tool_calls",
    "tool_message",
    "trace_messages",
    "trace_tool_schemas",
    "trace_tools",
    "turns_to_messages",
    "use_format",
    "with_hint",
    "with_solution",
]
