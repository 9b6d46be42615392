"""``composer-replication`` entry point.

Each subcommand lives in its own module ``composer_replication.cli.<module>`` exposing
``add_arguments(parser: argparse.ArgumentParser) -> None`` and ``run(args) -> int``. Only the module of
the command being run is imported, so ``--help`` and light commands start fast.

Exit codes: 0 success; 1 a user error (bad input, missing file or extra; the message says the fix);
2 usage errors (argparse); 141 when stdout's reader went away (``| head``), quietly; an exception
carrying an ``exit_code`` attribute exits with that code (3: the safety kill switch; 4: a spend
overrun, ``teacher_replay.ledger.SpendOverrun``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence

# name -> (module, one-line help). Order is the order of the pipeline.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "run the whole recipe offline on bundled sessions with a small model (no keys, no GPU)"),
    "run": (
        "run",
        "sessions -> redact -> replay -> pairs -> normalize -> train -> evaluate -> report, resumable",
    ),
    "status": ("status", "show where a run directory stands: stages done, spend, checkpoints"),
    "sessions": (
        "sessions",
        "list Claude Code / Codex sessions: project, start, turns, tool calls, errors, title",
    ),
    "ingest": (
        "ingest",
        "parse Claude Code / Codex session logs into states.jsonl and traces.jsonl (secrets redacted)",
    ),
    "replay": ("replay", "send each state to several teacher models under a hard dollar cap"),
    "pairs": ("pairs", "mine preference pairs where teachers agree against the student"),
    "export": ("export", "write ingested sessions as an OpenAI tool-calling dataset or Hub agent traces"),
    "normalize": ("normalize", "dedup and filter preference pairs with data-juicer"),
    "train": ("train", "train with the three-channel loss (offline SFT+SDPO+DPO, or GRPO via TRL)"),
    "validate": ("validate", "check a config file without loading a model"),
    "tasks": ("tasks", "mine validated coding tasks from your sessions and their repositories"),
    "eval": ("eval", "score a policy on a task set: pass@1, share of checks passing, per-task rows"),
    "rollout": ("rollout", "run a model as a coding agent on sandboxed tasks; record Claude Code sessions"),
    "launch": ("launch", "run DiLoCo replicas on local processes, Modal, HF Jobs, SageMaker or EKS"),
    "smoke": ("smoke", "a few compose_loss training steps on the default model; prints per-channel losses"),
}


def _top_parser() -> argparse.ArgumentParser:
    from composer_replication import __version__

    epilog = "commands:\n" + "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items())
    epilog += "\n\nRun `composer-replication COMMAND --help` for a command's options."
    p = argparse.ArgumentParser(
        prog="composer-replication",
        description="Turn coding-agent sessions into training signal and post-train an open model.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("command", nargs="?", help="one of the commands below")
    return p


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a reader that goes away (``composer-replication status RUN | head -1``) ends it
    quietly with exit 141, as a command killed by SIGPIPE would, instead of a BrokenPipeError traceback.

    Run as the program (``argv`` None: the console script, ``python -m``), it ends with ``gc.freeze()``:
    the process exits next, and the interpreter's last cyclic collection over everything a command
    imported (torch, transformers, a model) took seconds on a busy machine (4.4 s -> 0.8 s measured
    after loading SmolLM2), which a Ctrl-C waited for. Atexit handlers still run and reference counting
    still frees what it frees; only that last cyclic pass skips them (Python does not promise the
    finalisers of objects still alive at exit in any case).
    """
    try:
        try:
            return _main(argv)
        finally:  # argparse's --help/--version exit too: a pipe closed early fails here, not at exit
            sys.stdout.flush()
            if argv is None:
                gc.freeze()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush finds no pipe to fail on.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0].startswith("-"):
        top.parse_args(argv)
        top.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        top.error(f"unknown command {name!r}; choose from: {', '.join(COMMANDS)}")
    module = importlib.import_module(f"composer_replication.cli.{COMMANDS[name][0]}")
    parser = argparse.ArgumentParser(
        prog=f"composer-replication {name}",
        description=(module.__doc__ or COMMANDS[name][1]).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # user-facing errors get one clear line; bugs keep their traceback
        code = getattr(exc, "exit_code", None)
        if code is not None:
            print(f"composer-replication {name}: stopped: {exc}", file=sys.stderr)
            return int(code)
        if isinstance(exc, _USER_ERRORS):
            print(f"composer-replication {name}: error: {_one_line(exc)}", file=sys.stderr)
            return 1
        raise


# Errors about the user's input (values, paths, missing extras): one line, no traceback.
_USER_ERRORS = (
    ValueError, FileNotFoundError, ImportError, PermissionError,
    IsADirectoryError, NotADirectoryError, FileExistsError,
)  # fmt: skip


def _one_line(exc: BaseException) -> str:
    """An OSError raised by the runtime reads "[Errno 21] Is a directory: 'x'"; say it plainly."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror.lower()}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
