"""Error classification on texts seen in real Claude Code / Codex logs."""

from __future__ import annotations

import pytest

from composer_replication.ingestion.errors import classify_error, detect_failure, exit_code_of


@pytest.mark.parametrize(
    ("text", "code", "kind"),
    [
        ("<tool_use_error>InputValidationError: Task failed due to the following issue:\nThe required parameter `prompt` is missing</tool_use_error>", None, "type_error"),
        ("<tool_use_error>File has not been read yet. Read it first before writing to it.</tool_use_error>", None, "file_not_read"),
        ("<tool_use_error>String to replace not found in file.\nString:   defp do_setup do", None, "edit_mismatch"),
        ("Exit code 1\n(eval):1: permission denied:", 1, "permission_denied"),
        ("The user doesn't want to proceed with this tool use. The tool use was rejected", None, "user_rejected"),
        ("lsd: 3: No such file or directory (os error 2).", None, "file_not_found"),
        ("PreToolUse:Read hook error: blocked", None, "hook_blocked"),
        ("Pre-commit validation failed:\\n\\n[FORMAT] Code is not formatted.", None, "hook_blocked"),
        ("File content (528.1KB) exceeds maximum allowed size (256KB).", None, "output_too_large"),
        ("Error: No such tool available: Reed", None, "tool_not_found"),
        ("failed to parse function arguments: expected value at line 1 column 1", None, "json_decode"),
        ("Command timed out after 2m 0s", None, "timeout"),
        ("", 124, "timeout"),
        ("Traceback (most recent call last):\n  File \"x.py\", line 1\nZeroDivisionError: division by zero", 1, "runtime_error"),
        # issue 15: a failed build that prints TypeError ran fine as a tool call: not a schema error
        ("Exit code 1\n> next build\nTypeError: Cannot read properties of undefined (reading 'map')\n    at Page", 1, "runtime_error"),
        ("Exit code 1\nTypeError: f() got an unexpected keyword argument 'x'", 1, "runtime_error"),
        ("Exit code 1\njson.decoder.JSONDecodeError: Expecting value: line 1 column 1", 1, "runtime_error"),
        ("MCP tool failed: TypeError: fetch failed", None, "runtime_error"),
        # zsh and fish write it in lower case
        ("Exit code 127\nzsh:1: no such file or directory: ./run.sh", 127, "file_not_found"),
        ("Exit code 1\ncat: missing.txt: no such file or directory", 1, "file_not_found"),
    ],
)  # fmt: skip
def test_classify(text: str, code: int | None, kind: str) -> None:
    assert classify_error(text, exit_code=code) == kind


def test_exit_codes_and_failure_detection() -> None:
    assert exit_code_of("Chunk ID: 1\nProcess exited with code 2\nOutput:\n") == 2
    assert exit_code_of("ok", {"output": "", "metadata": {"exit_code": 3}}) == 3
    assert exit_code_of("ok", {"stdout": "", "exitCode": 0}) == 0
    assert (
        exit_code_of("HTTP 200", {"code": 200, "result": "..."}) is None
    )  # WebFetch's HTTP status is not an exit code
    assert detect_failure("all good", is_error_flag=False) == (False, None)
    assert detect_failure("Exit code 2\nboom", is_error_flag=False) == (True, 2)
    assert detect_failure("partial", is_error_flag=False, structured={"interrupted": True})[0]
    assert detect_failure("x", is_error_flag=True) == (True, None)
    assert detect_failure(
        "",
        is_error_flag=False,
        structured={"denied": True},
    ) == (False, None)
    assert classify_error("anything", denial="permission-rule") == "permission_denied"


def _alternatives(pattern: str) -> list[str]:
    """The top-level and grouped ``|`` alternatives of a regex source, each with its surrounding text."""
    out, depth, start, cls, esc = [], 0, 0, False, False
    for i, c in enumerate(pattern):
        if esc:
            esc = False
        elif c == "\\":
            esc = True
        elif cls:
            cls = c != "]"
        elif c == "[":
            cls = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    out.append(pattern[start:])
    return out


def test_every_rule_alternative_holds_one_of_its_prefilter_literals() -> None:
    """classify_error runs a rule's regex only when one of its literals occurs: each alternative of each
    rule (groups expanded) must contain one, else a real match would be missed."""
    import itertools
    import re

    from composer_replication.ingestion.errors import _RULES, RULE_LITERALS

    def expand(alt: str) -> list[str]:  # one level of (?:a|b) groups, then [Xx] case pairs folded
        m = re.search(r"\(\?:((?:[^()]|\([^()]*\))*)\)\??", alt)
        if m is None:
            return [re.sub(r"\[([A-Za-z])([A-Za-z])\]", r"\1", alt).lower()]
        inner = _alternatives(m.group(1)) + ([""] if m.group(0).endswith("?") else [])
        return list(
            itertools.chain.from_iterable(expand(alt[: m.start()] + x + alt[m.end() :]) for x in inner)
        )

    assert set(RULE_LITERALS) == {k for k, _ in _RULES}
    for kind, rx in _RULES:
        for alt in _alternatives(rx.pattern):
            for variant in expand(alt):
                pieces = re.split(r"\.\{\d+,\d+\}|\\d\+|\\b|\?", variant)
                assert any(lit in p.replace("\\", "") for p in pieces for lit in RULE_LITERALS[kind]), (
                    kind,
                    variant,
                )
    # And on texts: the prefilter never changes a classification.
    texts = ["Tool Foo was not found", "Unexpected keyword argument 'x'", "Timeout expired", "[Request interrupted",
             "Found 3 matches of the string", "Failed to find context", "could not parse the json", "hook denied"]  # fmt: skip
    for t in texts:
        plain = next((k for k, rx in _RULES if rx.search(t)), "runtime_error")
        assert classify_error(t) == plain, t
