"""Test commands recognised in an episode's shell calls, rewritten as checks that run in the sandbox.

A Bash / shell command line is split into simple commands the way bash does (the sandbox tripwire's
lexer, `datagen.policy`); ``VAR=value`` prefixes and wrappers (``timeout 60``, ``env``, ``uv run``,
``poetry run``, ...) are stripped; ``cd DIR`` before the runner moves the check's directory. Recognised
runners, and the check each becomes (only the tests or files the command named are kept; output
options, ``| tail`` and the like are dropped):

==========================================================  =================================================
``pytest``, ``py.test``, ``python -m pytest``, ``uv run       ``python3 -m pytest -q -p no:cacheprovider
pytest``                                                    [TARGETS] [-k EXPR] [-m EXPR]``
``python -m unittest [TARGETS]``                            ``python3 -m unittest [TARGETS]``
``npm|pnpm|yarn|bun test``, ``npm run test``                ``npm test`` (etc.), arguments after ``--``
``go test [PKGS] [-run RE]``                                ``go test PKGS [-run RE]``
``cargo test [NAME]``                                       ``cargo test --offline [NAME]``
``make test|check``, ``mix test [FILES]``                   the same
==========================================================  =================================================

A check whose directory leaves the repository is dropped; its text is what `Redactor` leaves unchanged
(a command carrying a secret is dropped, not rewritten).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from composer_replication.datagen.policy import LexError, Word, _lex

_OPS_SPLIT = {"&&", "||", ";", "|", "|&", "&", "\n", "(", ")", ";;"}
_RUNNER_WRAPPERS = {
    "uv": ("run",),
    "poetry": ("run",),
    "pipenv": ("run",),
    "pdm": ("run",),
    "hatch": ("run",),
}
_PLAIN_WRAPPERS = {"timeout", "env", "nice", "time", "nohup", "command", "exec", "stdbuf"}
_PYTEST_VALUE_OPTS = {"-k", "-m"}
_PYTEST_SKIP_VALUE = {"-p", "-c", "-o", "--rootdir", "--tb", "-n", "--maxfail", "--junitxml", "--cov", "-W"}
_MIX_SKIP_VALUE = {"--seed", "--max-failures", "--formatter", "--slowest", "--only", "--exclude"}
_GO_VALUE_OPTS = {"-run", "-count", "-timeout", "-tags", "-p", "-parallel", "-bench", "-skip"}


@dataclass(frozen=True)
class Check:
    """A test command as it runs in the task's workspace (``cd SUB && ...`` where needed)."""

    command: str
    runner: str


def simple_commands(cmd: str) -> list[list[str]]:
    """The argv of each simple command in ``cmd`` (``VAR=x`` prefixes removed); [] if it is not shell."""
    try:
        toks, _ = _lex(cmd)
    except (LexError, RecursionError):
        return []
    out: list[list[str]] = []
    argv: list[str] = []
    redirect = False
    for tok in [*toks, "\n"]:
        if isinstance(tok, Word):
            if redirect:
                redirect = False
            elif argv or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tok.text):
                argv.append(tok.text)
        elif tok in _OPS_SPLIT:
            if argv:
                out.append(argv)
            argv = []
        else:
            redirect = True  # a redirection: its target word is not an argument
    return out


def find_checks(command: str, subdir: str, tops: tuple[str, ...] = ()) -> list[Check]:
    """The test runs in one shell command line run in ``subdir`` (repository-relative; "" = the top);
    ``tops`` are the repository's top-level paths an absolute ``cd`` may name."""
    checks: list[Check] = []
    here: str | None = subdir
    for argv in simple_commands(command):
        argv = _unwrap(argv)
        if not argv:
            continue
        if argv[0] == "cd":
            here = _cd(here, argv[1] if len(argv) > 1 else "", tops)
            continue
        rewritten = _runner(argv)
        if rewritten is None or here is None:
            continue
        runner, named = rewritten
        args = _relative_args(named, here, tops)
        if args is None:
            continue  # it names a test outside the repository
        line = shlex.join(args)
        checks.append(Check(f"cd {shlex.quote(here)} && {line}" if here else line, runner))
    return checks


def _relative_args(args: list[str], here: str, tops: tuple[str, ...]) -> list[str] | None:
    """Absolute test paths inside the repository made relative to the check's directory; None if one is
    outside it."""
    out = []
    for a in args:
        if a.startswith("/"):
            path, sep, node = a.partition("::")
            rel = _cd("", path, tops)
            if rel is None:
                return None
            a = posixpath.relpath(rel or ".", here or ".") + sep + node
        out.append(a)
    return out


def _cd(here: str | None, target: str, tops: tuple[str, ...]) -> str | None:
    if target.startswith("/"):
        t = posixpath.normpath(target)
        return next((t[len(top) :].lstrip("/") for top in tops if t == top or t.startswith(top + "/")), None)
    if here is None or not target or target.startswith(("~", "$", "-")):
        return None  # an absolute or unknown directory: later runs cannot be placed in the repository
    p = posixpath.normpath(posixpath.join(here or ".", target))
    return None if p == ".." or p.startswith("../") else ("" if p == "." else p)


def _unwrap(argv: list[str]) -> list[str]:
    while argv:
        prog = posixpath.basename(argv[0])
        if prog in _RUNNER_WRAPPERS and len(argv) > 1:
            k = 1
            while k < len(argv) and argv[k].startswith("-"):
                k += 2 if argv[k] in ("--with", "--python", "-p", "--extra", "--group") else 1
            if k < len(argv) and argv[k] in _RUNNER_WRAPPERS[prog]:
                argv = argv[k + 1 :]
                continue
            return argv
        if prog in _PLAIN_WRAPPERS:
            k = 1
            while k < len(argv) and (argv[k].startswith("-") or "=" in argv[k] or argv[k][:1].isdigit()):
                k += 1
            argv = argv[k:]
            continue
        return argv
    return argv


def _runner(argv: list[str]) -> tuple[str, list[str]] | None:
    prog = posixpath.basename(argv[0])
    args = argv[1:]
    if prog in ("pytest", "py.test"):
        return "pytest", _pytest(args)
    if re.fullmatch(r"python(3(\.\d+)?)?", prog) and len(args) >= 2 and args[0] == "-m":
        if args[1] == "pytest":
            return "pytest", _pytest(args[2:])
        if args[1] == "unittest":
            return "unittest", ["python3", "-m", "unittest", *[a for a in args[2:] if not a.startswith("-")]]
    if prog in ("npm", "pnpm", "yarn", "bun") and args:
        k = 1 if args[0] in ("test", "t") else 2 if args[:2] == ["run", "test"] else 0
        if k:
            extra = args[args.index("--") :] if "--" in args else []
            return prog, [prog, "test", *extra]
    if prog == "go" and args[:1] == ["test"]:
        return "go", ["go", "test", *_keep(args[1:], _GO_VALUE_OPTS)]
    if prog == "cargo" and args[:1] == ["test"]:
        names = [a for a in args[1:] if not a.startswith("-")][:1]
        return "cargo", ["cargo", "test", "--offline", *names]
    if prog == "make" and args[:1] in (["test"], ["check"]):
        return "make", ["make", args[0]]
    if prog == "mix" and args[:1] == ["test"]:
        return "mix", ["mix", "test", *_keep(args[1:], set(), _MIX_SKIP_VALUE)]
    return None


def _pytest(args: list[str]) -> list[str]:
    out = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return out + _keep(args, _PYTEST_VALUE_OPTS, _PYTEST_SKIP_VALUE)


def _keep(args: list[str], keep_value: set[str], skip_value: set[str] | None = None) -> list[str]:
    """Positional arguments (tests, files, packages) and the options in ``keep_value`` with their values."""
    out: list[str] = []
    k = 0
    while k < len(args):
        a = args[k]
        if a in keep_value and k + 1 < len(args):
            out += [a, args[k + 1]]
            k += 2
        elif skip_value and a in skip_value:
            k += 2
        elif a.startswith("-") or a in ("|", ">"):
            k += 1
        else:
            out.append(a)
            k += 1
    return out


def shell_command(tool_name: str, tool_input: Any) -> tuple[str, str] | None:
    """``(command line, workdir or "")`` of a Claude Code ``Bash`` or Codex ``shell``/``exec_command`` call."""
    if not isinstance(tool_input, dict):
        return None
    cmd = tool_input.get("command", tool_input.get("cmd"))
    workdir = tool_input.get("workdir") or tool_input.get("cwd") or ""
    if isinstance(cmd, list) and all(isinstance(c, str) for c in cmd):
        if len(cmd) >= 3 and posixpath.basename(cmd[0]) in ("bash", "sh", "zsh") and cmd[1] in ("-c", "-lc"):
            cmd = cmd[2]
        else:
            cmd = shlex.join(cmd)
    if not isinstance(cmd, str) or tool_name not in ("Bash", "shell", "exec_command", "local_shell"):
        return None
    return cmd, workdir if isinstance(workdir, str) else ""
