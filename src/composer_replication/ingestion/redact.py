"""Secret redaction for ingested sessions: typed placeholders, counted per type.

What is covered: provider API keys with a recognisable shape (OpenAI, Anthropic, OpenRouter, AWS access
key ids, GCP API keys, GitHub, GitLab, Slack tokens and webhooks, Stripe, Hugging Face), AWS secret keys
and GCP ``private_key_id`` values written next to their names, PEM private-key blocks (also inside JSON
strings, e.g. GCP service-account files), JWTs, ``Bearer``/``Basic`` credentials, passwords inside URLs
and connection strings, and ``.env``/YAML/JSON assignments to secret-looking names.

What is not covered: secrets without a recognisable shape or name (a bare 40-character random string, a
password typed into free text), and secrets split across several strings. Redaction is pattern based,
not proof: treat redacted data as sensitive-but-reviewed, not as public.

Every match becomes ``[REDACTED:<type>]``; placeholders never match again, so redaction is idempotent.
Each pattern is guarded by a cheap substring test so that ordinary text costs a few ``in`` checks.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

# (type, anchors, regex matched AT an anchor, value group (0 = the whole match), needs a word boundary before).
# A pattern runs only where one of its anchors occurs (found with ``str.find``, which is far faster than a
# regex scan); its regex is then matched at the few positions where it can start, so a string without anchors costs a few
# substring tests and nothing else. Anchors are short pieces of the match (at most 5 characters): CPython's
# substring search is several times slower for longer needles.
_PATTERNS: list[tuple[str, tuple[str, ...], str, int, bool]] = [
    (
        "private_key",
        ("-----",),
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[\s\S]*)",
        0,
        False,
    ),
    ("anthropic_key", ("sk-",), r"sk-ant-[a-z]{3,6}\d{2}-[A-Za-z0-9_\-]{20,}", 0, True),
    ("openrouter_key", ("sk-",), r"sk-or-(?:v\d-)?[A-Za-z0-9]{32,}", 0, True),
    (
        "openai_key",
        ("sk-",),
        r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_\-]{20,}|sk-[A-Za-z0-9]{20,}T3BlbkFJ[A-Za-z0-9]{20,}"
        r"|sk-(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}\b",
        0,
        True,
    ),
    ("aws_access_key", ("AKIA", "ASIA", "ABIA", "ACCA"), r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b", 0, True),
    (
        "aws_secret_key",
        ("aws", "AWS"),
        r"(?i)aws[A-Za-z0-9_\-. ]{0,20}?secret[A-Za-z0-9_\-. ]{0,20}?[\"']?\s*[:=]\s*[\"']?"
        r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
        1,
        False,
    ),
    ("gcp_private_key_id", ('"priv',), r"\"private_key_id\"\s*:\s*\"([a-f0-9]{40})\"", 1, False),
    ("gcp_api_key", ("AIza",), r"AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])", 0, True),
    (
        "github_token",
        ("gh", "githu"),
        r"gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}",
        0,
        True,
    ),
    ("gitlab_token", ("glpat", "gldt-", "glrt-"), r"(?:glpat|gldt|glrt)-[A-Za-z0-9_\-]{20,}", 0, True),
    ("slack_webhook", ("hooks",), r"hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9_/\-]{20,}", 0, False),
    ("slack_token", ("xox",), r"xox[abposre]-[A-Za-z0-9\-]{10,}", 0, True),
    (
        "stripe_key",
        ("_live", "_test"),
        r"(?:sk|rk|pk|whsec)_(?:live|test)_[A-Za-z0-9]{16,}",
        0,
        True,
    ),
    ("hf_token", ("hf_",), r"hf_[A-Za-z0-9]{30,}\b", 0, True),
    ("jwt", ("eyJ",), r"eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", 0, True),
    (
        "bearer_token",
        ("earer", "EARER", "asic "),
        r"(?i)(?:bearer|basic)\s+([A-Za-z0-9\-._~+/]{16,}=*)",
        1,
        True,
    ),
    ("url_password", ("://",), r"://[^\s:/@'\"]*:(?!\[REDACTED)([^\s@/'\"]{3,})@", 1, False),
    (
        "env_secret",
        # NAME=value / NAME: value / "name": "value" where NAME looks like a secret. The value must be quoted or
        # contain a digit, which skips code such as ``password = get_password()``.
        tuple(
            v
            for k in (
                "secre",
                "passw",
                "pwd",
                "token",
                "api_k",
                "apike",
                "api-k",
                "acces",
                "priva",
                "crede",
                "auth_",
            )
            for v in (k, k.upper(), k.capitalize())
        ),
        r"(?i)(?:secret|passw(?:or)?d|pwd|token|api[_\-]?key|access[_\-]?key|private[_\-]?key|"
        r"credentials?|auth[_\-]?key)(?:[_\-]?key)?s?[\"']?"
        r"[ \t]*[:=][ \t]*(?:[\"'](?!\[REDACTED)([^\"'\s]{6,})[\"']|(?=[^\s\"'#,;(){}\[\]<>]*\d)([^\s\"'#,;(){}\[\]<>]{8,}))",
        -1,
        False,
    ),
]

_PLACEHOLDER = "[REDACTED:{}]"
# How far before its anchor a pattern's match may start (anchors inside the match, e.g. "_key" in "api_key").
_BACK = {"stripe_key": 5, "bearer_token": 2}
_BY_ANCHOR: dict[str, list[tuple[int, str, re.Pattern[str], int, bool, int]]] = {}
for _prio, (_name, _anchors, _rx, _group, _wb) in enumerate(_PATTERNS):
    for _a in _anchors:
        _BY_ANCHOR.setdefault(_a, []).append(
            (_prio, _name, re.compile(_rx), _group, _wb, _BACK.get(_name, 0))
        )


class Redactor:
    """Replace secrets in strings (or nested JSON-like values) and count replacements per type.

    >>> r = Redactor()
    >>> r.redact("key=sk-proj-abcdefghijklmnopqrstuvwxyz0123")
    'key=[REDACTED:openai_key]'
    >>> dict(r.counts)
    {'openai_key': 1}
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.counts: Counter[str] = Counter()

    def redact(self, text: str) -> str:
        if not self.enabled or len(text) < 8:
            return text
        spans: list[tuple[int, int, int, str]] = []
        for pos, anchor in _anchor_hits(text):
            for prio, name, rx, group, wb, back in _BY_ANCHOR[anchor]:
                # The match starts at most `back` characters before the anchor.
                for st in range(max(0, pos - back), pos + 1):
                    if wb and st and (text[st - 1].isalnum() or text[st - 1] == "_"):
                        continue
                    m = rx.match(text, st)
                    if m is not None:
                        g = group if group != -1 else (1 if m.group(1) is not None else 2)
                        spans.append((m.start(g), m.end(g), prio, name))
                        break
        if not spans:
            return text
        spans.sort()
        out, last = [], 0
        for s, e, _, name in spans:
            if s < last:  # overlapping a span already replaced (the same secret seen by two patterns)
                continue
            out.append(text[last:s])
            out.append(_PLACEHOLDER.format(name))
            self.counts[name] += 1
            last = e
        out.append(text[last:])
        return "".join(out)

    def redact_obj(self, obj: Any) -> Any:
        """Redact every string inside a JSON-like value (dict keys are kept)."""
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            return {k: self.redact_obj(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.redact_obj(v) for v in obj]
        return obj


def _build_automaton() -> Any:
    try:
        import ahocorasick  # pyahocorasick: one C pass for all anchors instead of one str.find per anchor
    except ImportError:
        return None
    automaton = ahocorasick.Automaton()
    for anchor in _BY_ANCHOR:
        automaton.add_word(anchor, anchor)
    automaton.make_automaton()
    return automaton


_AUTOMATON = _build_automaton()


def _anchor_hits(text: str) -> Iterator[tuple[int, str]]:
    """``(start, anchor)`` for every anchor occurrence (any order; overlaps are merged by the caller)."""
    if _AUTOMATON is not None:
        for end, anchor in _AUTOMATON.iter(text):
            yield end - len(anchor) + 1, anchor
        return
    for anchor in _BY_ANCHOR:
        pos = text.find(anchor)
        while pos != -1:
            yield pos, anchor
            pos = text.find(anchor, pos + 1)


def redact_text(text: str) -> str:
    """Redact one string with a throwaway :class:`Redactor` (convenience for callers outside ingestion)."""
    return Redactor().redact(text)


SECRET_TYPES: tuple[str, ...] = tuple(p[0] for p in _PATTERNS)
