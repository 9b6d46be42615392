"""A session's conversation (as the ingestion parsers assemble it) cut into episodes: one per user request
that led to file changes.

A *turn* is one message the user typed plus everything up to the next one. Turns are grouped:

- a turn with recorded changes (successful ``Edit``/``MultiEdit``/``Write``/``apply_patch`` calls) starts an
  episode; the turns without changes just before it (questions, "yes, go ahead") are its preamble;
- a message sent right after the user interrupted the agent (``[Request interrupted by user]``) is a
  follow-up: its turn joins the episode it interrupted;
- the turns without changes after an episode (up to the next one) still belong to it for its test runs:
  they ran on the episode's final files; those that ran no test are also the next episode's preamble.

Instruction = the episode's messages up to its last change. Compaction summaries, slash-command echoes
and interrupt markers are not messages the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from composer_replication.tasks.checks import find_checks, shell_command
from composer_replication.tasks.edits import EDIT_TOOLS, Op, patch_text

_NOT_TYPED = ("<command-name>", "<command-message>", "<local-command-", "<bash-input>", "<bash-stdout>")
_INTERRUPT = "[Request interrupted by user"


@dataclass
class Turn:
    index: int  # 1-based number of the user message in the session
    text: str
    ts: str
    ops: list[Op] = field(default_factory=list)
    commands: list[tuple[str, str]] = field(default_factory=list)  # (command line, workdir)
    reads: list[tuple[str, str, str]] = field(
        default_factory=list
    )  # Read calls: (path, cwd, output), in order
    n_ops_before_read: list[int] = field(default_factory=list)  # how many ops came before each read
    after_interrupt: bool = False  # sent right after the user interrupted the agent
    end_ts: str = ""


@dataclass
class Episode:
    index: int  # 1-based, in session order
    turns: list[Turn]  # preamble + changing turns (+ follow-ups)
    trailing: list[Turn] = field(default_factory=list)  # turns without changes after it

    @property
    def ops(self) -> list[Op]:
        return [op for t in self.turns for op in t.ops]

    @property
    def commands(self) -> list[tuple[str, str]]:
        return [c for t in [*self.turns, *self.trailing] for c in t.commands]

    def reads_before_changes(self) -> list[tuple[str, str, str]]:
        """The ``Read`` results the episode saw before its first change (they show the starting files)."""
        out = []
        for t in self.turns:
            out += [r for r, n in zip(t.reads, t.n_ops_before_read, strict=True) if n == 0]
            if t.ops:
                break
        return out

    @property
    def messages(self) -> list[str]:
        last = max(i for i, t in enumerate(self.turns) if t.ops)
        return [t.text for t in self.turns[: last + 1]]

    @property
    def turn_range(self) -> tuple[int, int]:
        return self.turns[0].index, self.turns[-1].index

    @property
    def start_ts(self) -> str:
        """When the first change's request was sent (HEAD at that moment is the starting commit)."""
        return next((t.ts for t in self.turns if t.ops and t.ts), "") or self.turns[0].ts

    @property
    def end_ts(self) -> str:
        times = [t.end_ts or t.ts for t in [*self.turns, *self.trailing] if t.end_ts or t.ts]
        return max(times) if times else ""


def turns(conv: Any, cwd: str) -> list[Turn]:
    """The user turns of a conversation (``ingestion`` Conversation), with their changes and shell runs."""
    out: list[Turn] = []
    pending_interrupt = False
    for s, seg in enumerate(conv.segments):
        for k, ev in enumerate(seg):
            if ev.kind == "user":
                text = ev.text.strip()
                if (s > 0 and k == 0) or text.startswith(_NOT_TYPED):
                    continue  # a compaction summary, or a slash command's echo
                if text.startswith(_INTERRUPT):
                    pending_interrupt = True
                    continue
                out.append(Turn(len(out) + 1, ev.text, ev.ts, after_interrupt=pending_interrupt))
                pending_interrupt = False
            elif ev.kind == "tool" and out:
                turn = out[-1]
                turn.end_ts = ev.ts or turn.end_ts
                _add_tool(turn, ev, cwd)
    return out


def _add_tool(turn: Turn, ev: Any, cwd: str) -> None:
    name, inp = ev.tool_name, ev.tool_input
    shell = shell_command(name, inp)
    if shell is not None:
        cmd, workdir = shell
        if patch_text(inp) is not None:
            if ev.error is None:
                turn.ops.append(Op("apply_patch", {"input": patch_text(inp)}, workdir or cwd))
        else:
            turn.commands.append((cmd, workdir or cwd))
    elif name in EDIT_TOOLS and ev.error is None and isinstance(inp, dict):
        turn.ops.append(Op(name, inp, cwd))
    elif (
        name == "Read"
        and ev.error is None
        and isinstance(inp, dict)
        and isinstance(inp.get("file_path"), str)
    ):
        turn.reads.append((inp["file_path"], cwd, ev.text))
        turn.n_ops_before_read.append(len(turn.ops))


def episodes(all_turns: list[Turn]) -> list[Episode]:
    """Group turns into episodes (module docstring)."""
    out: list[Episode] = []
    preamble: list[Turn] = []
    for t in all_turns:
        if t.ops:
            if out and t.after_interrupt and not preamble:
                out[-1].turns.append(t)  # a follow-up after an interrupt
                out[-1].trailing = []
            else:
                out.append(Episode(len(out) + 1, [*preamble, t]))
            preamble = []
        else:
            if out:
                out[-1].trailing.append(t)
            if not (out and any(find_checks(cmd, "") for cmd, _ in t.commands)):
                preamble.append(t)  # a turn that tested the last episode's work is not the next one's context
    return out
