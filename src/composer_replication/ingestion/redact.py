"""Secret redaction for ingested sessions: typed placeholders, counted per type.

What is covered (the shapes are in ``_redact_rules.py``, the list with examples in docs/ingestion.md):
provider API keys with a recognisable shape (OpenAI, Anthropic, OpenRouter, AWS access key ids, GCP API
keys, GitHub, GitLab, npm, Slack tokens and webhooks, Stripe, Hugging Face), AWS secret keys and GCP
``private_key_id`` values written next to their names (an AWS secret key also next to its ``AKIA`` id),
Sentry DSN keys, random-looking unnamed tokens in a value position (``_redact_entropy.py``), PEM
private-key blocks (also inside JSON strings, e.g. GCP service-account files), JWTs, ``Bearer``/``Basic``
credentials, passwords inside URLs and connection strings, values assigned to secret-looking names
(``.env``, YAML, JSON, code, ``--password X`` flags, ``getenv("NAME", "default")``), e-mail addresses, and
these secrets
- right after an escape (``key%3Dsk-ant-...``, ``\\nghp_...``),
- base64-encoded (a Kubernetes secret, a Docker ``auth``, an encoded ``.env``), for the known prefixes,
- split by a line continuation (a backslash-newline, also inside numbered ``Read`` output and ``+`` patch lines),
- used as a JSON key (``redact_obj`` redacts keys as well as values).

What is not covered: secrets without a recognisable shape or name outside a value position (a random token
inside a sentence, a string that is one bare token), a password typed into free text, secrets split across
several strings or string literals, other encodings (hex, rot13, gzip, URL-encoding inside the secret),
e-mail addresses at uncommon generic top-level domains. Redaction is pattern based, not proof: treat
redacted data as sensitive-but-reviewed, not as public.

Every match becomes ``[REDACTED:<type>]``; placeholders never match again, so redaction is idempotent.
Each rule runs only where one of its short anchors occurs (one Aho-Corasick pass, ``_redact_scan``, finds
all of them); the unnamed-token check runs only where a 32-character run occurs (one ``bytes.translate`` +
``find``), so ordinary text costs two scans and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _redact_entropy as entropy
from composer_replication.ingestion._redact_rules import BASE64_PREFIXES, RULES, Find
from composer_replication.ingestion._redact_scan import RustScanner as _RustScanner
from composer_replication.ingestion._redact_scan import build_scanner, find_hits

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is optional: redact_obj then walks every string
    _orjson = None  # type: ignore[assignment]

__all__ = ["SECRET_TYPES", "Redactor"]

_PLACEHOLDER = "[REDACTED:{}]"
_BASE64 = "base64_secret"
_ENTROPY = "high_entropy"
# A backslash-newline joins two lines (shell, Python, C). The next line may start with a ``Read`` line number
# (``    12→`` or ``    12<TAB>`` as ``cat -n`` writes it) or a ``+`` (an added patch line) before the text.
_LINE_PREFIX = re.compile("[ \\t]*\\d+(?:\u2192|\\t)|\\+")
_CONTINUATION = re.compile("\\\\\\r?\\n(?:" + _LINE_PREFIX.pattern + ")?")
_B64_RUN = re.compile(r"[A-Za-z0-9+/_\-]*")
_B64_WINDOW = 8192  # characters decoded after an anchor: covers a 4096-bit RSA key in PEM form


def _b64_anchors(first_chars: set[str]) -> dict[str, list[tuple[bytes, int, int]]]:
    """Pieces of the base64 encodings of each prefix that do not depend on the surrounding bytes.

    The prefix may start at any of the 3 byte offsets of a base64 group; for each offset, the characters
    whose 6 bits all lie inside the prefix are fixed. From those, a piece of 4-8 characters is taken that
    starts with a character some anchor already starts with where possible (``first_chars``): the
    automaton's cost per scanned character grows with the number of distinct first characters, so each
    new one is chosen to serve as many prefixes as it can. Value: ``(prefix, offset, index of the piece's
    first character counted from the start of the prefix's first base64 group)``.
    """
    fixed: list[tuple[bytes, int, str, int]] = []
    for prefix in BASE64_PREFIXES:
        n = len(prefix)
        for off in range(3):
            enc = base64.b64encode(b"\0" * off + prefix).decode()
            known = [i for i in range(len(enc)) if 6 * i >= 8 * off and 6 * i + 6 <= 8 * (off + n)]
            if len(known) >= 4:
                fixed.append((prefix, off, enc[known[0] : known[-1] + 1], known[0]))
    starts = set(first_chars)
    out: dict[str, list[tuple[bytes, int, int]]] = {}
    pending = fixed
    while pending:
        left = []
        for prefix, off, frag, first in pending:
            i = next((i for i in range(len(frag) - 3) if frag[i] in starts), None)
            if i is None:
                left.append((prefix, off, frag, first))
                continue
            piece = frag[i : i + 8]
            for p in {piece, piece.replace("+", "-").replace("/", "_")}:
                out.setdefault(p, []).append((prefix, off, first + i))
        pending = left
        if left:  # admit the first character that serves the most remaining prefixes
            votes = Counter(c for _, _, frag, _ in left for c in set(frag[: len(frag) - 3]))
            starts.add(votes.most_common(1)[0][0])
    return out


_BY_ANCHOR: dict[str, list[tuple[int, str, Find]]] = {}
for _prio, (_name, _anchors, _find) in enumerate(RULES):
    for _a in _anchors:
        _BY_ANCHOR.setdefault(_a, []).append((_prio, _name, _find))
_B64_BY_ANCHOR = _b64_anchors({a[0] for a in _BY_ANCHOR})


_ALL_ANCHORS = (*_BY_ANCHOR, *_B64_BY_ANCHOR)
_AUTOMATON = build_scanner(list(_ALL_ANCHORS))


def _find_hits(text: str) -> Iterator[tuple[int, str]]:
    """``(end, anchor)`` for every anchor occurrence, as the automaton reports them (fallback scan)."""
    return find_hits(text, _ALL_ANCHORS)


def _b64_lines(text: str, start: int, i: int) -> list[tuple[int, int]]:
    """The pieces of the base64 run that starts at ``start`` (``i``: a position inside it), following
    ``base64``'s 76- and PEM's 64-column line wrapping, also under ``Read`` line numbers or patch ``+``;
    at most ``_B64_WINDOW`` characters past ``i`` (a secret is short; a long run is an image)."""
    pieces = []
    limit = i + _B64_WINDOW
    while True:
        i = _B64_RUN.match(text, i, max(i, limit)).end()  # type: ignore[union-attr]
        if i - start in (64, 76) and i < limit and text.startswith("\n", i):
            m = _LINE_PREFIX.match(text, i + 1)
            nxt = m.end() if m else i + 1
            if _B64_RUN.match(text, nxt, nxt + 1).end() > nxt:  # type: ignore[union-attr]
                pieces.append((start, i))
                start = i = nxt
                continue
        while text.startswith("=", i):
            i += 1
        pieces.append((start, i))
        return pieces


def _b64_find(text: str, pos: int, anchor: str) -> tuple[int, int] | None:
    """The whole base64 run around ``pos`` if it decodes to text holding a secret, else ``None``."""
    start, stop = pos, max(0, pos - 256)  # bytes before the prefix (``user:`` of ``user:token``), not far
    while start > stop and (text[start - 1].isalnum() or text[start - 1] in "+/_-"):
        start -= 1
    if text.startswith("+", start) and (start == 0 or text[start - 1] == "\n"):
        start += 1  # an added patch line
    pieces = _b64_lines(text, start, pos)
    for prefix, off, first in _B64_BY_ANCHOR[anchor]:
        group = pos - first
        if group < pieces[0][0]:
            continue
        chunk = text[group : pieces[0][1]] + "".join(text[a:b] for a, b in pieces[1:])
        chunk = chunk[:_B64_WINDOW].rstrip("=")
        chunk = chunk[: len(chunk) - 1] if len(chunk) % 4 == 1 else chunk + "=" * (-len(chunk) % 4)
        altchars = b"-_" if ("-" in chunk or "_" in chunk) else None
        try:
            raw = base64.b64decode(chunk, altchars=altchars)
        except (binascii.Error, ValueError):
            continue
        if raw[off : off + len(prefix)] == prefix and _spans(raw.decode("utf-8", "replace"), nested=True):
            return start, pieces[-1][1]
    return None


def _spans(text: str, *, nested: bool = False) -> list[tuple[int, int, int, str]]:
    """``(start, end, priority, type)`` of every secret in ``text`` (overlapping spans are merged later)."""
    spans: list[tuple[int, int, int, str]] = []
    try:
        data: bytes | None = text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the scanner takes its fallback
        data = None
    if isinstance(_AUTOMATON, _RustScanner):
        hits = _AUTOMATON.iter(text, data)
    else:
        hits = _AUTOMATON.iter(text) if _AUTOMATON is not None else _find_hits(text)
    for end, anchor in hits:
        pos = end - len(anchor) + 1
        for prio, name, find in _BY_ANCHOR.get(anchor, ()):
            span = find(text, pos)
            if span is not None and span[1] > span[0]:
                spans.append((span[0], span[1], prio, name))
        if not nested and anchor in _B64_BY_ANCHOR:
            span = _b64_find(text, pos, anchor)
            if span is not None:
                spans.append((span[0], span[1], len(RULES), _BASE64))
    if not nested and len(text) >= entropy.MIN_LEN:
        found = entropy.find_all(text, text.encode("utf-8", "surrogatepass") if data is None else data)
        if found:
            spans.extend((s, e, len(RULES) + 1, _ENTROPY) for s, e in found)
    return spans


def _joined(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` with line continuations removed, and ``(joined position, characters removed so far)`` per cut."""
    parts, cuts, last, removed = [], [], 0, 0
    for m in _CONTINUATION.finditer(text):
        parts.append(text[last : m.start()])
        removed += m.end() - m.start()
        cuts.append((m.end() - removed, removed))
        last = m.end()
    parts.append(text[last:])
    return "".join(parts), cuts


def _to_original(j: int, cuts: list[tuple[int, int]]) -> int:
    shift = 0
    for at, removed in cuts:
        if at > j:
            break
        shift = removed
    return j + shift


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
        if not self.enabled or len(text) < 6:
            return text
        if "\\" in text and ("\\\n" in text or "\\\r\n" in text):  # one fast scan for the usual text
            joined, cuts = _joined(text)
            spans = [
                (_to_original(s, cuts), _to_original(e - 1, cuts) + 1, p, n) for s, e, p, n in _spans(joined)
            ]
        else:
            spans = _spans(text)
        if not spans:
            return text
        # Merge overlapping spans (one secret seen by two rules, a key inside a longer match); the type of
        # the earliest-starting (then longest, then first-listed) span names the placeholder.
        spans.sort(key=lambda s: (s[0], -s[1], s[2]))
        out, last = [], 0
        for s, e, _, name in spans:
            if s < last:
                if e > last:
                    last = e  # extends the span already replaced
                continue
            out.append(text[last:s])
            out.append(_PLACEHOLDER.format(name))
            self.counts[name] += 1
            last = e
        out.append(text[last:])
        return "".join(out)

    def redact_obj(self, obj: Any) -> Any:
        """Redact every string inside a JSON-like value, dict keys included."""
        if isinstance(obj, str):
            return self.redact(obj)
        if not self.enabled:
            return obj
        if isinstance(obj, (dict, list)):
            return self.redact_json(obj, compact_json(obj))
        return self._redact_walk(obj)

    def redact_json(self, obj: dict[str, Any] | list[Any], encoded: bytes | None) -> Any:
        """:meth:`redact_obj` of a dict or list whose compact JSON the caller already has (``orjson.dumps(obj)``;
        ``None`` when it could not be encoded): that text is scanned as it is, not encoded again."""
        if not self.enabled or (encoded is not None and _clean_json_text(encoded)):
            return obj  # nothing in it can match: the same value (not a copy)
        return self._redact_walk(obj)

    def _redact_walk(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.redact(obj)
        if isinstance(obj, dict):
            out: dict[Any, Any] = {}
            for k, v in obj.items():
                if isinstance(k, str):
                    base = k2 = self.redact(k)
                    n = 1
                    while k2 != k and k2 in out:  # two keys that redact alike stay two keys
                        n += 1
                        k2 = f"{base}#{n}"
                    k = k2
                out[k] = self._redact_walk(v)
            return out
        if isinstance(obj, list):
            return [self._redact_walk(v) for v in obj]
        return obj


def compact_json(obj: Any) -> bytes | None:
    """``obj``'s compact JSON as orjson writes it, or ``None`` when orjson is absent or cannot encode it
    (lone surrogates, integers over 64 bits, nesting past its limit): the text :meth:`Redactor.redact_json`
    scans, and the ingester's cheap depth bound."""
    if _orjson is None:
        return None
    try:
        return _orjson.dumps(obj)
    except (TypeError, ValueError):
        return None


def _clean_json_text(encoded: bytes) -> bool:
    """True when no string (key or value) of the value whose compact JSON is ``encoded`` (:func:`compact_json`)
    can hold a secret, from one scan of that text.

    Every rule starts at an anchor (a short literal), and an anchor inside a string is also a substring of the
    compact JSON encoding: only ``"``, ``\\`` and control characters are escaped there, and the one anchor with
    a quote (``"priv``) keeps it after the escaping backslash. A line continuation (backslash + newline, which
    ``redact`` removes before scanning, so it can join an anchor) shows as ``\\\\\\n`` or ``\\\\\\r``: such
    values, values orjson cannot encode, and values with any anchor take the string-by-string walk.
    """
    if b"\\\\\\n" in encoded or b"\\\\\\r" in encoded or entropy.may_have(encoded):
        return False
    if isinstance(_AUTOMATON, _RustScanner):
        return not _AUTOMATON.any_in(encoded)
    text = encoded.decode()
    if _AUTOMATON is not None:
        return next(iter(_AUTOMATON.iter(text)), None) is None
    return next(_find_hits(text), None) is None


SECRET_TYPES: tuple[str, ...] = (*dict.fromkeys(r[0] for r in RULES), _BASE64, _ENTROPY)


@functools.cache
def rules_id() -> str:
    """A hash of the redaction rules in use (the bytes of this module and of the rule table's module, as
    installed: source, bytecode or compiled; the scanner's too). Stored text redacted under other rules is redacted again: the
    ingest index keeps it, and a change re-parses every session file."""
    from composer_replication.ingestion import _redact_rules, _redact_scan

    return files_id([__file__, _redact_rules.__file__, _redact_scan.__file__, entropy.__file__])


def files_id(paths: list[str | None]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes() if p else b"?")
    return h.hexdigest()[:16]
