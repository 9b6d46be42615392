"""The work of one project folder in an ingest run (a unit that can run in a worker process).

Resumed-session duplicates are dropped against the earlier files of the same folder, so a folder is processed
in order, start to end: each file's part is brought up to date (parsed fresh, resumed at its last complete
line, or left alone), its duplicates are found from the uuid digests of the files before it, and its rows are
either re-assembled or marked to be copied from the previous outputs (when nothing that decides them
changed). Returns per-file results; the caller writes them in order.
"""

from __future__ import annotations

import gc
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composer_replication.ingestion import _index as ix
from composer_replication.ingestion import _json
from composer_replication.ingestion._base import AssemblyInputs
from composer_replication.ingestion._files import SessionFileError, read_session_bytes, split_lines
from composer_replication.ingestion._select import is_trivial, project_dir
from composer_replication.ingestion._session import IngestionStats

OUTPUTS = ("states.jsonl", "traces.jsonl", "sessions.jsonl")
PARSE_STATE = frozenset(
    "offset tail part_bytes ctx lines tail_lines n_lines asm_key asm_stats ranges stats".split()
)


@dataclass
class FolderJob:
    out: str
    files: list[tuple[str, dict[str, Any], str, str]]  # (path, index entry, status, trace base id), in order
    agents: list[str]
    clean: bool  # nothing in the folder changed and the previous outputs are usable: copy every file's rows
    reuse: bool  # the previous outputs are usable (a file whose assembly inputs did not change is copied)
    options: dict[str, Any]  # the run's options (all of them decide the rows)
    previous: str | None = None  # store id of the previous outputs (the ones saved ranges point into)
    ingester_kw: dict[str, Any] = field(default_factory=dict)


@dataclass
class FileResult:
    path: str
    entry: dict[str, Any]
    status: str
    rows: dict[str, bytes] | None = None  # None: copy the rows from the previous outputs (entry["ranges"])
    error: str | None = None


_INGESTERS: dict[str, Any] = {}


def ingesters(kw: dict[str, Any]) -> dict[str, Any]:
    """One ingester per format and option set in this process (a worker builds its own)."""
    from composer_replication.ingestion.claude_code import ClaudeCodeIngester
    from composer_replication.ingestion.codex import CodexIngester
    from composer_replication.ingestion.redact import Redactor

    key = json.dumps({k: v for k, v in kw.items() if k != "token_counter"}, sort_keys=True, default=str)
    key += f"{id(kw.get('token_counter'))}:{id(Redactor)}"  # the class too: a benchmark swaps it
    if _INGESTERS.get("key") != key:
        args = {k: v for k, v in kw.items() if k != "redact"}
        args["redactor"] = Redactor(enabled=kw["redact"])
        _INGESTERS.clear()
        _INGESTERS.update(key=key, claude_code=ClaudeCodeIngester(**args), codex=CodexIngester(**args))
    return _INGESTERS


def process_folder(job: FolderJob) -> list[FileResult]:
    with no_gc():
        return _process_folder(job)


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while parsing: millions of short-lived dicts and lists, no cycles; its
    passes over the live items cost ~20% of the ingest time. Restored on exit."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _process_folder(job: FolderJob) -> list[FileResult]:
    out = Path(job.out)
    ing = ingesters(job.ingester_kw)
    seen: set[bytes] = set()
    results = []
    for path, e, status, base in job.files:
        f = Path(path)
        try:
            if status != "new" and not part_ok(out, e):
                status = "rewritten"  # its part is missing or short: parse again
                e = {k: v for k, v in e.items() if k not in PARSE_STATE}
            items = None
            if status != "unchanged":
                items = parse(ing[e["format"]], out, f, e, status)
            inputs = AssemblyInputs(
                agents_with_files=set(job.agents), link=link(f) if f.name.startswith("agent-") else {}
            )
            if e["format"] == "claude_code" and not job.clean:
                packed = _part_path(out, e, ".uuids").read_bytes()  # parse() wrote it for a parsed file
                digests = ix.iter_digests(packed)
                inputs.drop = {i for i, d in digests if d in seen}
                seen.update(d for _, d in digests)
            asm = {"base": base, "drop": ix.to_ranges(inputs.drop), "agents": job.agents, "link": inputs.link}
            if job.clean:
                akey = e.get("asm_key")
            else:
                sig = [e["part_bytes"], e["offset"], e.get("tail"), e["size"], e["mtime_ns"]]
                akey = ix.digest([asm, sig, job.options])
            # Rows can be copied only from the outputs the saved byte ranges point into (the previous run's).
            copyable = job.reuse and "ranges" in e and e.get("ranges_of") == job.previous
            if (job.clean or akey == e.get("asm_key")) and copyable:
                results.append(FileResult(path, e, status))
                continue
            if items is None:
                items = ix.read_part(_part_path(out, e, ".jsonl"))
            e["asm_stats"], rows = assemble(
                ing[e["format"]], f, e, items, inputs, asm, job.options["keep_trivial"]
            )
            e["asm_key"] = akey
            e["stats"] = file_stats(e)
            results.append(FileResult(path, e, status, rows))
        except (Exception, RecursionError) as exc:  # one file's surprise must not stop the others
            msg = (
                str(exc)
                if isinstance(exc, SessionFileError)
                else f"{f}: {type(exc).__name__}: {str(exc)[:200]}"
            )
            results.append(FileResult(path, e, status, error=msg))
    return results


def _part_path(out: Path, e: dict[str, Any], suffix: str) -> Path:
    return out / "parts" / f"{e['part']}{suffix}"


def part_ok(out: Path, e: dict[str, Any]) -> bool:
    """The file's part is there and holds at least the items the index vouches for."""
    base = os.path.join(out, "parts", e.get("part", ""))
    try:
        size = os.stat(base + ".jsonl").st_size
        if e["format"] == "claude_code":
            os.stat(base + ".uuids")
    except (OSError, KeyError):
        return False
    return size >= e.get("part_bytes", 1 << 62)


def parse(ing: Any, out: Path, f: Path, e: dict[str, Any], status: str) -> list[dict[str, Any]]:
    """Bring the file's part up to date (in ``e``); returns all its items."""
    part = _part_path(out, e, ".jsonl")
    if status == "appended":
        old_items = ix.read_part(part, e["part_bytes"])
        with open(f, "rb") as fh:
            fh.seek(e["offset"])
            data = fh.read()
        lines = IngestionStats.from_dict(e["lines"])
        ctx, base_line, base = dict(e["ctx"]), e["n_lines"], e["offset"]
    else:
        old_items, data, lines = [], read_session_bytes(f), IngestionStats()
        ctx, base_line, base = {"file": f.name}, 0, 0
    pieces = split_lines(data)  # split once: the complete lines, then what follows the last newline
    last = pieces.pop()
    n_complete, cut = len(pieces), len(data) - len(last)
    new = ing.parse_bytes(pieces, lines, ctx, base_line + 1)
    tail_stats = IngestionStats()
    tail = ing.parse_bytes([last], tail_stats, dict(ctx), base_line + n_complete + 1)
    enc_new, enc_tail = ix.encode_items(new), ix.encode_items(tail)
    if status == "appended":
        ix.append_part(part, e["part_bytes"], enc_new, enc_tail)
    else:
        ix.write_part(part, enc_new, enc_tail)
    tail_fp: str | None = ""  # None: the file could not be read back (the next run re-reads it)
    if base + cut:
        tail_fp = ix.tail_hash(data, cut) if base == 0 else ix.file_tail_hash(f, base + cut)
    e.update(offset=base + cut, tail=tail_fp, n_lines=base_line + n_complete, ctx=ctx, lines=lines.sparse(),
             part_bytes=(e["part_bytes"] if status == "appended" else 0) + len(enc_new),
             tail_lines=tail_stats.sparse())  # fmt: skip
    items = old_items + new + tail
    if e["format"] == "claude_code":
        _part_path(out, e, ".uuids").write_bytes(ix.uuid_digests(items))
    return items


def file_stats(e: dict[str, Any]) -> dict[str, Any]:
    """One file's counters (line, unterminated tail and assembly), saved so an unchanged file costs nothing."""
    st = IngestionStats.from_dict(e["lines"])
    st.add(e.get("tail_lines", {}))
    st.add(e["asm_stats"])
    st.n_files = 1
    out = st.finish().sparse()
    out["bad_lines"] = (e["lines"].get("bad_lines", []) + e.get("tail_lines", {}).get("bad_lines", []))[:5]
    return out


def assemble(
    ing: Any, f: Path, e: dict[str, Any], items: list[dict[str, Any]], inputs: AssemblyInputs,
    asm: dict[str, Any], keep_trivial: bool,
) -> tuple[dict[str, Any], dict[str, bytes]]:  # fmt: skip
    stats = IngestionStats()
    traces = ing.traces(f, items, stats, inputs, asm["base"])
    if not traces and not stats.skipped_subagent:
        stats.n_traces_trivial += 1  # not a single conversation record (only bookkeeping, a summary, ...)
    parts: dict[str, list[dict[str, Any]]] = {n: [] for n in OUTPUTS}
    for t in traces:
        if not keep_trivial and is_trivial(t):
            stats.n_traces_trivial += 1
            uncount(stats, t)
            continue
        parts["states.jsonl"].extend(t.states)
        parts["traces.jsonl"].extend(t.examples)
        parts["sessions.jsonl"].append(session_row(t, f, e, asm))
    return stats.sparse(), {n: _json.dumps_lines(v) for n, v in parts.items()}


def uncount(stats: IngestionStats, t: Any) -> None:
    """Take a trace that is left out back out of the counters that describe the rows written (traces,
    states, examples, assistant turns, tool calls, tool errors and their kinds): the summary counts what
    the outputs hold."""
    stats.n_traces -= 1
    stats.n_states_emitted -= len(t.states)
    stats.n_examples -= len(t.examples)
    asst = [x for x in t.turns if x["role"] == "assistant"]
    stats.n_assistant_turns -= len(asst)
    stats.n_tool_use_blocks -= sum(len(x["tool_calls"]) for x in asst)
    for x in t.turns:
        if x["role"] == "tool" and x.get("tool_error") is not None:
            stats.n_tool_errors -= 1
            kind = str((x.get("error_meta") or {}).get("error_kind"))
            if stats.error_kinds.get(kind, 0) > 1:
                stats.error_kinds[kind] -= 1
            else:
                stats.error_kinds.pop(kind, None)


def session_row(t: Any, f: Path, e: dict[str, Any], asm: dict[str, Any]) -> dict[str, Any]:
    m = t.meta
    cwd = m.get("cwd") or e.get("cwd")
    asst = [x for x in t.turns if x["role"] == "assistant"]
    row = {
        "trace_id": t.trace_id, "source": t.source, "file": str(f), "part": e["part"],
        "project": cwd or project_dir(f).name, "session_id": m.get("session_id") or e.get("session_id"),
        "start": m.get("start"), "end": m.get("end"), "title": m.get("title"), "usage": m.get("usage"),
        "n_turns": len(asst), "n_states": len(t.states), "n_examples": len(t.examples),
        "n_tool_calls": sum(len(x["tool_calls"]) for x in asst),
        "n_tool_errors": sum(1 for x in t.turns if x["role"] == "tool" and x.get("tool_error") is not None),
    }  # fmt: skip
    if not row["title"] and (request := first_request(t.turns)):
        row["title"], row["title_from"] = request, "first_request"
    for k in ("sidechain", "agent_id", "parent_tool_use_id", "parent", "parent_session", "subagents", "from"):
        if k in m:
            row[k] = m[k]
    return {**row, "asm": asm}


_COMMAND_RX = re.compile(r"<command-name>(.*?)</command-name>", re.S)
_ARGS_RX = re.compile(r"<command-args>(.*?)</command-args>", re.S)
_TAG_RX = re.compile(r"</?[A-Za-z][\w-]*>")


def first_request(turns: list[dict[str, Any]], limit: int = 100) -> str:
    """A title for a session whose log has none: its first user request, on one line, at most ``limit``
    characters (as claude-code-log shows a session without a summary)."""
    for x in turns:
        if x["role"] == "user" and isinstance(x.get("content"), str):
            text = x["content"]
            cmd = _COMMAND_RX.search(text)
            if cmd is not None:  # a slash command: its name and arguments, not the CLI's wrapper tags
                args = _ARGS_RX.search(text)
                text = cmd.group(1) + (" " + args.group(1) if args else "")
            text = " ".join(_TAG_RX.sub(" ", text).split())
            if text:
                return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return ""


def link(f: Path) -> dict[str, Any]:
    """A subagent transcript's parent call, from its ``agent-<id>.meta.json`` when present."""
    out: dict[str, Any] = {"agent_id": f.stem[len("agent-") :]}
    try:
        m = json.loads(f.with_name(f.stem + ".meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return out
    if isinstance(m, dict):
        for src, dst in (
            ("toolUseId", "parent_tool_use_id"),
            ("agentType", "agent_type"),
            ("description", "description"),
        ):
            if isinstance(m.get(src), str):
                out[dst] = m[src]
    return out
