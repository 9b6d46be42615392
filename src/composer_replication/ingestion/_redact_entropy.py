"""Unnamed random-looking tokens (``high_entropy``): a secret with neither a known shape nor a secret-like name.

A candidate is a run of 32-64 characters of ``[A-Za-z0-9_-]`` that stands alone (not part of a path, a URL, a
dotted name, an e-mail address, a longer base64 text or a wrapped base64 block). It is a secret when it looks
random rather than like a name: upper- and lower-case letters and a digit, no hex run of 12 (hashes, commit
ids and UUID parts are not secrets), no ``__``, not an alphabet listing, and under 30% of it in words whose
letter pairs are common in English (``Qwen2_5OmniForConditionalGeneration`` is 80% words; a random
40-character token is almost always under 10%). Measured on the transformers, trl, torch, datasets,
accelerate and peft sources: no false positive (docs/benchmarks/redaction.md); on random tokens
(base62, ``secrets.token_urlsafe``) about 99% are caught.

Text without a run of 32 such characters is ruled out by one ``bytes.translate`` + ``find`` (C speed).
"""

from __future__ import annotations

import re

MIN_LEN, MAX_LEN = 32, 64
_WORD_RX = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
_DIGIT_RX = re.compile(r"\d")
_HEX_RX = re.compile(r"[0-9a-f]{12}|[0-9A-F]{12}")
_B64_LINE_RX = re.compile(r"[A-Za-z0-9+/]{60,}=*[ \t]*")
# The 220 most frequent letter pairs inside words of the standard library's comments and docstrings.
_COMMON_PAIRS = frozenset(
    "th in he re er on te es en se at le or st ti al an nt ed ar me nd ng de et ec co io ne it ct ri is li il ta "
    "ra ur ro ma as tr fi ve ea fo ha ce ss ll pe ns ca am na la od di si ac el tu ex om nc ou hi ul pa un us ic "
    "ot ch lo pr ts im no ad ut mp ge wi rt rs rn ho po to pl um mo em ue ef ck op ai cl be oc ly pt su va ci rg "
    "ep bl ke rr xt ab ob ir iv sp lt do ow lu wh da os ie ol ty ni ee ry fr so bj bu up ig ls ia rm je ap ld sh "
    "id tt yt gu fa ag pp lf fu mb du wa sa ds ru if nu au mi gi yp qu cu tl rd ay ib ba ff av vi cr pu ev dd wo "
    "gs eg pi ov fe ze oo bo ip sc sy bi mm ys rc iz ey ui eq nl gn xc mu by nf ak nv wr we ew ub uc hr nn tc oi "
    "ny tw dr ua".split()
)
_RUN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
# bytes.translate table: run characters -> "a", everything else (UTF-8 bytes of other characters too) -> " ".
_TO_RUN = bytes(ord("a") if bytes([i]) in _RUN_CHARS else ord(" ") for i in range(256))
_LONG = b"a" * MIN_LEN
_BEFORE_NOT = frozenset("+/.@$%\\")  # glued to a path, URL, dotted name, address, variable or escape
_AFTER_NOT = frozenset("+/@")


def may_have(data: bytes) -> bool:
    """Whether ``data`` (UTF-8) has a run long enough to be a candidate (one C-speed pass)."""
    return _LONG in data.translate(_TO_RUN)


def wordy(v: str) -> float:
    """The share of ``v`` in English-looking words (3+ letters, 70% of their letter pairs common)."""
    n = 0
    for w in _WORD_RX.findall(v):
        if len(w) >= 3:
            w = w.lower()
            common = sum(w[i : i + 2] in _COMMON_PAIRS for i in range(len(w) - 1))
            if common >= 0.7 * (len(w) - 1):
                n += len(w)
    return n / len(v)


def looks_random(v: str) -> bool:
    if v.islower() or v.isupper() or _DIGIT_RX.search(v) is None:  # the usual identifiers, at C speed
        return False
    if sum(c.isupper() for c in v) < 2 or sum(c.islower() for c in v) < 2:
        return False
    if "__" in v or _HEX_RX.search(v):
        return False
    steps = sum(ord(b) - ord(a) == 1 for a, b in zip(v, v[1:], strict=False))
    return steps < len(v) // 4 and wordy(v) < 0.3  # "ABCDEFGH...0123456789" is a listing, not a key


def _in_b64_block(text: str, s: int, e: int) -> bool:
    """The run is a line of a wrapped base64 block (a certificate, an image): a long base64 line next to it."""
    if text.startswith("\n", e) and _B64_LINE_RX.match(text, e + 1):
        return True
    if s and text[s - 1] == "\n":
        prev = text.rfind("\n", 0, s - 1) + 1
        return _B64_LINE_RX.fullmatch(text, prev, s - 1) is not None
    return False


_VALUE_AFTER = frozenset("=:\"'`>\u2192\t")  # assigned, quoted, an XML value, a numbered line (Read, cat -n)
_FLAG_RX = re.compile(r"(?:^|\s)--?[A-Za-z][\w-]*[ \t]+$")


def _patch_line(text: str, s: int) -> bool:
    """``s`` starts an added line of a patch (``+`` at the line start)."""
    return text[s - 1] == "+" and (s == 1 or text[s - 2] == "\n")


def _value_position(text: str, s: int, e: int) -> bool:
    """The token is a value: assigned (``=``, ``:``), quoted, after a flag, a numbered file line, or a line of
    its own in a longer text. A whole string that is one token (an id field of a tool input) and a token
    inside prose are not."""
    i = s - 1 if s and _patch_line(text, s) else s
    while i > 0 and text[i - 1] == " ":
        i -= 1
    if i > 0 and text[i - 1] in _VALUE_AFTER:
        return True
    line_start = text.rfind("\n", 0, s) + 1
    if _FLAG_RX.search(text, line_start, s):
        return True
    j = e
    while j < len(text) and text[j] in " \t=":
        j += 1
    own_line = (i == 0 or text[i - 1] == "\n") and (j == len(text) or text[j] in "\r\n")
    return own_line and not (i == 0 and j == len(text))


def find_all(text: str, data: bytes) -> list[tuple[int, int]]:
    """Spans of the random-looking tokens in ``text`` (``data``: its UTF-8 bytes).

    The runs are found in ``data`` translated to run / not-run bytes (C speed; most texts end at the first
    ``find``). Run characters are ASCII, so a run's bytes are its characters; on non-ASCII text the byte
    offsets are mapped to character offsets by decoding the gaps between runs once."""
    t = data.translate(_TO_RUN)
    pos = t.find(_LONG)
    if pos < 0:
        return []
    out: list[tuple[int, int]] = []
    ascii_only = len(data) == len(text)
    b = c = 0  # a byte offset and the character offset it maps to
    while pos >= 0:
        end = t.find(b" ", pos)
        end = len(t) if end < 0 else end
        if ascii_only:
            span = _candidate(text, pos, end)
        else:
            c += len(data[b:pos].decode("utf-8", "surrogatepass"))
            b = pos
            span = _candidate(text, c, c + end - pos)
        if span is not None:
            out.append(span)
        pos = t.find(_LONG, end)
    return out


def _candidate(text: str, s: int, e: int) -> tuple[int, int] | None:
    """The run ``text[s:e]`` as a secret's span, or ``None``."""
    if e - s > MAX_LEN + 1:
        return None
    if s and text[s - 1] == "\\" and text[s] in "nrt":
        s += 1  # ``\\n`` glued to the token (an escaped newline in a JSON text)
    if not MIN_LEN <= e - s <= MAX_LEN or (s and text[s - 1] in _BEFORE_NOT and not _patch_line(text, s)):
        return None
    nxt = text[e : e + 2]
    if nxt[:1] in _AFTER_NOT or (nxt[:1] == "." and nxt[1:].isalnum()):
        return None
    if not looks_random(text[s:e]) or not _value_position(text, s, e) or _in_b64_block(text, s, e):
        return None
    while text.startswith("=", e) and e - s < MAX_LEN + 2:
        e += 1  # base64 padding
    return s, e
