"""The sandbox command tripwire: parse a shell command into simple commands and match their argv, not substrings.

What is covered: `check_command` tokenises a bash command line the way bash does for the parts that
matter here (single/double/ANSI-C quotes, backslashes, comments, ``;``/``&&``/``||``/``|``/``&``/newline,
subshells and braces, redirections, here-documents, ``$(...)``, backticks and ``<(...)``), then
inspects each simple command: its program (after ``VAR=x`` prefixes and wrappers such as ``sudo``,
``env``, ``timeout``, ``nohup``, ``xargs``, ``find -exec``), the shell code inside ``bash -c``/``eval``,
and every path-like argument and redirection target. Rules:

- ``network``: the program is curl, wget, nc, ncat, netcat, socat, ssh, scp, sftp, telnet or ftp;
- ``namespace_escape`` (nsenter, unshare, chroot, pivot_root), ``mount`` (mount, umount),
  ``privilege`` (sudo, su, doas, pkexec, setcap, capsh);
- ``secrets`` / ``host_proc`` / ``docker_socket``: an argument or redirection target *is* such a path
  (``/etc/shadow``, ``~/.ssh/id_*``, ``.aws/credentials``, ``.netrc``; ``/proc/1/environ|root|mem|...``,
  ``/proc/sys/kernel``; ``/var/run/docker.sock``, ``/run/containerd``), or inline interpreter code
  (``python -c``, ``perl -e``, ``node -e``, ...) mentions one;
- ``fork_bomb``: a shell function that pipes or backgrounds calls to itself (``:(){ :|:& };:``).

So ``grep 'curl ' log.txt`` (curl is data), ``ls ~/.ssh`` (listing is not reading a key) and
``echo "mount it"`` pass, while ``curl x``, ``FOO=1 /usr/bin/curl x``, ``bash -c 'wget x'``,
``echo $(nc -l 1)``, ``cat < /etc/shadow`` and ``sudo ls`` are reported.

What is not covered: this is a tripwire, never the boundary. Obfuscation (``c=cu; ${c}rl``, base64,
scripts written to a file and run later, a Python socket) is invisible to it; the isolation stops the
attempt regardless. A command the lexer cannot parse (e.g. an unterminated quote, which bash would
refuse to run) is checked with the legacy substring patterns instead, erring towards reporting.
"""

from __future__ import annotations

import codecs
import os
import re
from dataclasses import dataclass, field

NETWORK = {"curl", "wget", "nc", "ncat", "netcat", "socat", "ssh", "scp", "sftp", "telnet", "ftp"}
NAMESPACE = {"nsenter", "unshare", "chroot", "pivot_root"}
MOUNT = {"mount", "umount"}
PRIVILEGE = {"sudo", "su", "doas", "pkexec", "setcap", "capsh"}
SHELLS = {"bash", "sh", "dash", "zsh", "ksh", "busybox-sh"}
INTERPRETERS = {"python", "python3", "perl", "ruby", "node", "php"}
# wrapper -> options that take a value (the wrapped command follows the options)
WRAPPERS: dict[str, set[str]] = {
    "sudo": {"-u", "-g", "-C", "-h", "-p", "-r", "-t", "-U"},
    "doas": {"-u", "-C"},
    "pkexec": {"--user"},
    "env": {"-u", "-C", "-S"},
    "command": set(),
    "builtin": set(),
    "exec": {"-a"},
    "nohup": set(),
    "time": set(),
    "nice": {"-n"},
    "ionice": {"-c", "-n", "-p"},
    "setsid": set(),
    "stdbuf": {"-i", "-o", "-e"},
    "timeout": {"-s", "-k", "--signal", "--kill-after"},
    "xargs": {"-n", "-I", "-P", "-L", "-s", "-d", "-E", "-a", "--max-args", "--delimiter"},
    "watch": {"-n", "-d"},
    "strace": {"-e", "-o", "-p", "-s"},
    "ltrace": {"-e", "-o", "-p", "-s"},
    "flock": {"-w", "-E"},
    "chrt": set(),
    "taskset": set(),
    "busybox": set(),
}
_POSITIONAL_BEFORE_CMD = {"timeout": 1, "flock": 1, "chrt": 1, "taskset": 1}
_RESERVED_PREFIX = {"!", "{", "if", "then", "else", "elif", "while", "until", "do", "time"}
_RESERVED_SKIP = {"fi", "done", "esac", "}", "for", "case", "select", "in", "function", "[[", "]]"}
_DATA_ARGS = {"echo", "printf", ":", "true", "false", "test", "["}  # arguments are data, not paths read
_PATTERN_FIRST = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "sed", "awk", "gawk", "mawk"}
PATH_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("secrets", re.compile(r"/etc/g?shadow\b|\.ssh/id_|\.aws/credentials|\.netrc\b|\.docker/config\.json")),
    ("host_proc", re.compile(r"/proc/1/(root|environ|mem|cwd|fd|maps)|/proc/sys/kernel|/proc/sysrq-trigger")),
    ("docker_socket", re.compile(r"/var/run/docker\.sock|/run/docker\.sock|/run/containerd")),
]
# The pre-parser substring rules, used only for commands the lexer cannot parse.
_LEGACY: list[tuple[str, re.Pattern[str]]] = [
    ("namespace_escape", re.compile(r"\b(nsenter|unshare|chroot|pivot_root|setns)\b")),
    ("mount", re.compile(r"(^|[\s;&|(])(u?mount)\s")),
    ("privilege", re.compile(r"(^|[\s;&|(])(sudo|su|doas|setcap|capsh)\s")),
    ("fork_bomb", re.compile(r":\(\)\s*\{\s*:\s*\|\s*:\s*&\s*\}\s*;\s*:")),
    ("network", re.compile(r"(^|[\s;&|(`])(curl|wget|nc|ncat|socat|ssh|scp)\s")),
    *PATH_RULES,
]
_OPS = (
    "&&",
    "||",
    ";;",
    "|&",
    "&>>",
    "&>",
    ">>",
    ">|",
    ">&",
    "<<<",
    "<<-",
    "<<",
    "<&",
    "<>",
    ";",
    "&",
    "|",
    "(",
    ")",
    "<",
    ">",
    "\n",
)
_REDIRECTS = {"&>>", "&>", ">>", ">|", ">&", "<<<", "<&", "<>", "<", ">"}
_SEPARATORS = {"&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n"}


class LexError(ValueError):
    """The command is not well-formed shell (bash would refuse it too)."""


@dataclass
class Word:
    text: str
    subs: list[str] = field(default_factory=list)  # command substitutions inside the word


def _lex(s: str, i: int = 0, *, until_paren: bool = False) -> tuple[list[Word | str], int]:
    """Tokens (``Word`` or an operator string) from ``s[i:]``; stops after an unmatched ``)`` if asked."""
    toks: list[Word | str] = []
    heredocs: list[tuple[str, bool]] = []
    buf: list[str] | None = None
    subs: list[str] = []
    depth = 0

    def flush() -> None:
        nonlocal buf, subs
        if buf is not None:
            toks.append(Word("".join(buf), subs))
            if len(toks) >= 2 and toks[-2] in ("<<", "<<-"):
                heredocs.append((toks[-1].text, toks[-2] == "<<-"))  # type: ignore[union-attr]
        buf, subs = None, []

    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            if s[i + 1] != "\n":
                buf = (buf or []) + [s[i + 1]]
            i += 2
        elif c == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise LexError("unterminated single quote")
            buf = (buf or []) + [s[i + 1 : j]]
            i = j + 1
        elif c == "$" and s.startswith("$'", i):
            j = i + 2
            while j < len(s) and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            if j >= len(s):
                raise LexError("unterminated $'...'")
            buf = (buf or []) + [codecs.decode(s[i + 2 : j], "unicode_escape", errors="replace")]
            i = j + 1
        elif c == '"':
            i, text = _double_quoted(s, i + 1, subs)
            buf = (buf or []) + [text]
        elif c in "$`" or (c in "<>" and s.startswith("(", i + 1)):
            i = _substitution(s, i, subs)
            buf = buf or []
        elif c == "#" and buf is None:
            while i < len(s) and s[i] != "\n":
                i += 1
        elif c in " \t":
            flush()
            i += 1
        elif until_paren and c == ")" and depth == 0:
            flush()
            return toks, i + 1
        else:
            op = next((o for o in _OPS if s.startswith(o, i)), None)
            if op is None:
                buf = (buf or []) + [c]
                i += 1
                continue
            if op in _REDIRECTS and buf is not None and "".join(buf).isdigit():
                buf, subs = None, []  # "2>" : the digits name a file descriptor
            flush()
            depth += {"(": 1, ")": -1}.get(op, 0)
            toks.append(op)
            i += len(op)
            if op == "\n" and heredocs:
                i = _skip_heredocs(s, i, heredocs)
    if until_paren:
        raise LexError("unterminated $(...)")
    flush()
    return toks, i


def _double_quoted(s: str, i: int, subs: list[str]) -> tuple[int, str]:
    out: list[str] = []
    while i < len(s):
        c = s[i]
        if c == '"':
            return i + 1, "".join(out)
        if c == "\\" and i + 1 < len(s) and s[i + 1] in '$`"\\\n':
            out.append("" if s[i + 1] == "\n" else s[i + 1])
            i += 2
        elif c in "$`":
            i = _substitution(s, i, subs)
        else:
            out.append(c)
            i += 1
    raise LexError("unterminated double quote")


def _substitution(s: str, i: int, subs: list[str]) -> int:
    """Consume ``$(...)``, ``$((...))``, ``${...}``, ``$name``, a backtick pair or ``<(...)`` at ``s[i]``."""
    if s.startswith("$((", i):
        j = s.find("))", i + 3)
        if j < 0:
            raise LexError("unterminated $((...))")
        return j + 2
    if s.startswith("$(", i) or s[i] in "<>":
        _, end = _lex(s, i + 2, until_paren=True)
        subs.append(s[i + 2 : end - 1])
        return end
    if s.startswith("${", i):
        j = s.find("}", i + 2)
        if j < 0:
            raise LexError("unterminated ${...}")
        return j + 1
    if s[i] == "`":
        j = i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise LexError("unterminated backtick")
        subs.append(s[i + 1 : j].replace("\\`", "`"))
        return j + 1
    j = i + 1  # $name, $1, $@ ...: a value unknown here
    while j < len(s) and (s[j].isalnum() or s[j] == "_"):
        j += 1
    return max(j, i + 2 if i + 1 < len(s) and s[i + 1] in "@*#?$!-0123456789" else j)


def _skip_heredocs(s: str, i: int, heredocs: list[tuple[str, bool]]) -> int:
    while heredocs:
        delim, strip_tabs = heredocs.pop(0)
        while i < len(s):
            j = s.find("\n", i)
            line = s[i : len(s) if j < 0 else j]
            i = len(s) if j < 0 else j + 1
            if (line.lstrip("\t") if strip_tabs else line) == delim:
                break
    return i


def _unwrap(argv: list[str], found: set[str], nested: list[str]) -> list[str]:
    """Strip wrappers (``sudo``, ``env``, ``timeout 5``, ``xargs -n1``, ``bash -c CODE``...) from ``argv``."""
    while argv:
        prog = os.path.basename(argv[0])
        if prog in _RESERVED_PREFIX:
            argv = argv[1:]
            continue
        if prog in PRIVILEGE:
            found.add("privilege")
        if prog in SHELLS or prog == "su":
            code = next(
                (argv[k + 1] for k, a in enumerate(argv[:-1]) if re.fullmatch(r"-[a-z]*c[a-z]*", a)), None
            )
            if code is not None:
                nested.append(code)  # checked as a command line of its own
            return [] if prog == "su" or code is not None else argv
        if prog == "command" and any(a in ("-v", "-V") for a in argv[1:]):
            return []  # `command -v curl` asks whether curl exists
        if prog == "eval":
            nested.append(" ".join(argv[1:]))
            return []
        if prog == "find":
            for k, a in enumerate(argv):
                if a in ("-exec", "-execdir", "-ok", "-okdir"):
                    end = next((m for m in range(k + 1, len(argv)) if argv[m] in (";", "+")), len(argv))
                    nested.append(" ".join(_quote(w) for w in argv[k + 1 : end]))
            return argv
        if prog not in WRAPPERS:
            return argv
        takes_value, k = WRAPPERS[prog], 1
        positional = _POSITIONAL_BEFORE_CMD.get(prog, 0)
        while k < len(argv):
            a = argv[k]
            if a == "--":
                k += 1
                break
            if a.startswith("-") and len(a) > 1:
                k += 2 if a in takes_value else 1
            elif prog == "env" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", a):
                k += 1
            elif positional:
                positional -= 1
                k += 1
            else:
                break
        argv = argv[k:]
    return argv


def _quote(w: str) -> str:
    return "'" + w.replace("'", "'\\''") + "'"


def _path_hits(word: str) -> set[str]:
    word = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
    return {name for name, pat in PATH_RULES if pat.search(word)}


def _check(cmd: str, found: set[str], depth: int) -> None:
    if depth > 8:
        return
    toks, _ = _lex(cmd)
    nested: list[str] = []
    commands: list[tuple[list[str], list[str], str | None]] = []  # (argv, redirect targets, next op)
    argv: list[str] = []
    targets: list[str] = []
    redirect: str | None = None
    for tok in [*toks, "\n"]:
        if isinstance(tok, Word):
            nested += tok.subs
            if redirect is not None:
                if redirect != "<<<":  # a here-string's word is data, not a path
                    targets.append(tok.text)  # a file, or a here-doc delimiter (harmless to check)
                redirect = None
            elif argv or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tok.text):
                argv.append(tok.text)
            else:
                targets.append(tok.text.split("=", 1)[1])  # VAR=value: the value may name a path
        elif tok in _REDIRECTS or tok in ("<<", "<<-"):
            redirect = tok
        else:
            commands.append((argv, targets, tok))
            argv, targets = [], []
    functions: dict[str, int] = {}
    brace = 0
    for idx, (argv, targets, op) in enumerate(commands):
        for t in targets:
            found |= _path_hits(t)
        if argv and argv[0] == "function" and len(argv) >= 2:
            functions[argv[1]] = brace
            argv = argv[2:]
        if op == "(" and len(argv) == 1 and idx + 1 < len(commands) and not commands[idx + 1][0]:
            functions[argv[0]] = brace  # name ( ) { body }
            continue
        brace += argv.count("{") - argv.count("}")
        argv = _unwrap([a for a in argv if a not in ("{", "}")], found, nested)
        if not argv or os.path.basename(argv[0]) in _RESERVED_SKIP:
            continue
        prog = os.path.basename(argv[0])
        prev_op = commands[idx - 1][2] if idx else None
        in_body = prog in functions and brace > functions[prog]
        if in_body and (op in ("|", "&", "|&") or prev_op in ("|", "|&")):
            found.add("fork_bomb")
        for rule, names in (("network", NETWORK), ("namespace_escape", NAMESPACE), ("mount", MOUNT)):
            if prog in names:
                found.add(rule)
        found |= _path_hits(argv[0])
        args = argv[1:]
        if prog in INTERPRETERS or re.fullmatch(r"python3(\.\d+)?", prog):
            for k, a in enumerate(args[:-1]):
                if a in ("-c", "-e", "-E", "-r") or a.startswith("--eval"):
                    found |= {name for name, pat in PATH_RULES if pat.search(args[k + 1])}
        if prog in _DATA_ARGS:
            continue
        if prog in _PATTERN_FIRST:
            explicit = any(a in ("-e", "-f", "--regexp", "--file") for a in args)
            first = next((k for k, a in enumerate(args) if not a.startswith("-")), None)
            args = [a for k, a in enumerate(args) if explicit or k != first]
        for a in args:
            found |= _path_hits(a)
    for code in nested:
        _check(code, found, depth + 1)


def check_command(cmd: str) -> list[str]:
    """Names of the policy rules ``cmd`` trips, in a fixed order (empty when none). Pure function."""
    found: set[str] = set()
    try:
        _check(cmd, found, 0)
    except (LexError, RecursionError):
        found = {name for name, pat in _LEGACY if pat.search(cmd)}
    order = [
        "namespace_escape",
        "mount",
        "privilege",
        "host_proc",
        "docker_socket",
        "secrets",
        "fork_bomb",
        "network",
    ]
    return [name for name in order if name in found]
