"""``ingest_paths``: session files -> an ingest output folder, incrementally.

Per run: list the files (naming what had to be skipped), decide per file from the index whether it is new,
unchanged, appended (parse from its last complete line) or rewritten (parse again), re-assemble only what an
input change can reach (a changed file and, in its project folder, the files after it: resumed-session
duplicates are dropped against earlier files), copy everything else's rows from the previous outputs, and
write ``states.jsonl``, ``traces.jsonl``, ``sessions.jsonl``, ``store.json``, ``ingest_stats.json`` and the
index atomically. The result is byte-for-byte what a fresh full ingest of the same files writes (tested).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_open, atomic_write_json
from composer_replication._lock import directory_lock
from composer_replication.ingestion import _index as ix
from composer_replication.ingestion import _json
from composer_replication.ingestion._base import failed
from composer_replication.ingestion._files import SessionFileError, read_session_bytes, scan_session_files
from composer_replication.ingestion._folder import OUTPUTS, FileResult, FolderJob, process_folder
from composer_replication.ingestion._index_check import check_index, drop_bad_ranges, seal
from composer_replication.ingestion._select import Filters, head_info, project_dir
from composer_replication.ingestion._session import IngestionStats
from composer_replication.ingestion.store import EXAMPLES_FORMAT, FORMAT_VERSION, STATES_FORMAT, header

_OUTPUTS = OUTPUTS


class _Previous:
    """The previous run's outputs, mapped, to copy the rows of files whose inputs did not change."""

    def __init__(self, out: Path, usable: bool) -> None:
        self.usable = usable
        self.old: dict[str, bytes | mmap.mmap] = {}
        if usable:
            for name in _OUTPUTS:
                try:
                    with open(out / name, "rb") as fh:
                        size = os.fstat(fh.fileno()).st_size
                        self.old[name] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                except (OSError, ValueError):
                    self.usable = False

    def copy(self, name: str, rng: list[int], fh: Any) -> list[int]:
        start = fh.tell()
        fh.write(self.old[name][rng[0] : rng[1]])
        return [start, fh.tell()]

    def close(self) -> None:
        for m in self.old.values():
            if isinstance(m, mmap.mmap):
                m.close()


def ingest_paths(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    redact: bool = True,
    system_prompt: str | None = None,
    skip_sidechain: bool = True,
    strip_thinking: bool = True,
    max_history_tokens: int | None = None,
    example_max_tokens: int = 8192,
    token_counter: Callable[[str], int] | None = None,
    progress: bool = False,
    force: bool = False,
    since: Any = None,
    until: Any = None,
    project: str | list[str] | None = None,
    session: str | list[str] | None = None,
    keep_trivial: bool = False,
    jobs: int = 1,
) -> dict[str, Any]:
    """Ingest session files/folders into ``out_dir`` (see docs/ingestion.md) and return the stats dict.

    Incremental: unchanged files are not read, appended files are parsed from their last complete line,
    and only what changed is re-assembled (``force=True`` starts from scratch). Filters: ``since``/``until``
    (dates or ISO times, on the session's first timestamp), ``project`` (globs on the working directory or the
    Claude project folder), ``session`` (session ids or prefixes); trivial sessions (no assistant turn, or
    only a "Warmup" exchange) are left out unless ``keep_trivial``. Everything left out is counted.
    ``jobs > 1`` processes project folders in that many worker processes (same output, byte for byte).
    """
    from composer_replication.ingestion.redact import rules_id
    from composer_replication.wire import SYSTEM_PROMPT

    out = Path(out_dir)
    paths = list(paths)
    keep = None if not skip_sidechain else _not_subagent
    files, skipped = scan_session_files(paths, keep=keep)
    if not files:
        why = f" ({len(skipped)} skipped: {skipped[0]['path']}: {skipped[0]['reason']})" if skipped else ""
        raise FileNotFoundError(f"no *.jsonl session files under {', '.join(map(str, paths))}{why}")
    if not redact:
        import warnings

        warnings.warn(
            "secret redaction is OFF: API keys in the sessions will be written to disk", stacklevel=2
        )
    filters = Filters.make(since, until, project, session)
    system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
    # The parts hold redacted text: a change of the redaction rules re-parses every file (re-redacts them).
    parse_opts = {"redact": redact, "skip_sidechain": skip_sidechain, "rules": rules_id() if redact else None}
    options = {**parse_opts, "system_prompt": system_prompt, "strip_thinking": strip_thinking,
               "max_history_tokens": max_history_tokens, "example_max_tokens": example_max_tokens,
               "token_counter": getattr(token_counter, "__qualname__", None), "keep_trivial": keep_trivial}  # fmt: skip
    kw = dict(system_prompt=system_prompt, strip_thinking=strip_thinking, max_history_tokens=max_history_tokens,
              token_counter=token_counter, redact=redact, example_max_tokens=example_max_tokens,
              skip_sidechain=skip_sidechain)  # fmt: skip
    with directory_lock(out, "ingest output folder"):
        return _ingest_locked(out, files, skipped, filters, options, parse_opts, kw, force, progress, jobs)


def _ingest_locked(
    out: Path, files: list[Path], skipped: list[dict[str, str]], filters: Filters, options: dict[str, Any],
    parse_opts: dict[str, Any], kw: dict[str, Any], force: bool, progress: bool, jobs: int,
) -> dict[str, Any]:  # fmt: skip
    """The run, while this process holds ``out``'s lock (one ingest per output folder at a time)."""
    from composer_replication.ingestion.redact import Redactor

    skip_sidechain, token_counter = kw["skip_sidechain"], kw["token_counter"]
    idx = check_index(
        ix.load_index(out, parse_opts) if not force else ix.load_index(Path("/nonexistent"), parse_opts)
    )
    scrub = Redactor(enabled=kw["redact"]).redact  # the index keeps the working directory as the items do

    total = IngestionStats()
    absp: dict[Path, str] = {}
    per_file: dict[Path, dict[str, Any]] = {}
    entries: dict[Path, dict[str, Any]] = {}
    status: dict[Path, str] = {}
    for f in files:
        key = absp[f] = os.path.abspath(f)
        old = idx["files"].get(key)
        try:
            st = f.stat()
            if old and old["size"] == st.st_size and old["mtime_ns"] == st.st_mtime_ns:
                entries[f], status[f] = old, "unchanged"
                continue
            info = head_info(f, read_session_bytes(f, 65536))
            if "cwd" in info:
                info["cwd"] = scrub(info["cwd"])
        except (SessionFileError, OSError) as exc:
            msg = (
                str(exc)
                if isinstance(exc, SessionFileError)
                else f"{f}: no such file (deleted or moved after it was listed?)"
            )
            total.add(failed(IngestionStats(n_files=1), msg))
            per_file[f] = {"file": str(f), "error": msg}
            continue
        e = {"part": ix.part_name(absp[f]), "size": st.st_size, "mtime_ns": st.st_mtime_ns, **info}
        if (
            old
            and old["format"] == info["format"]
            and "offset" in old
            and st.st_size >= old["offset"]
            and old.get("tail") is not None
        ):
            appended = old["offset"] > 0 and ix.file_tail_hash(f, old["offset"]) == old["tail"]
            status[f] = "appended" if appended else "rewritten"
            if appended:
                e = {**old, **e, "first_ts": old["first_ts"]}
        else:
            status[f] = "rewritten" if old else "new"
        entries[f] = e
    chosen = [f for f in entries if filters.keep(f, entries[f])]
    total.n_sessions_filtered = len(entries) - len(chosen)

    # Trace ids: the file stem, made unique across folders when two files share one.
    stems: dict[str, list[Path]] = {}
    for f in chosen:
        stems.setdefault(f.stem, []).append(f)
    base_id = {
        f: f.stem if len(fs) == 1 else f"{f.stem}~{ix.part_name(absp[f])[:8]}"
        for fs in stems.values()
        for f in fs
    }
    agents: dict[Path, list[str]] = {}
    if not skip_sidechain:
        for f in chosen:
            if f.name.startswith("agent-"):
                agents.setdefault(project_dir(f), []).append(f.stem[len("agent-") :])
    by_dir: dict[Path, list[Path]] = {}
    for f in chosen:
        by_dir.setdefault(f.parent, []).append(f)
    for fs in by_dir.values():
        fs.sort(key=lambda p: (entries[p].get("first_ts", ""), p.name))
    order = [f for d in sorted(by_dir) for f in by_dir[d]]
    store_id = ix.digest(
        [
            FORMAT_VERSION,
            options,
            [(absp[f], entries[f]["size"], entries[f]["mtime_ns"]) for f in order],
        ]
    )
    prev = _Previous(out, _outputs_match(out, idx))
    drop_bad_ranges(entries.values(), prev.old, idx["outputs"])
    (out / "parts").mkdir(parents=True, exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm

        todo = sum(entries[f]["size"] for f in order if status[f] != "unchanged")
        bar = tqdm(total=todo, unit="B", unit_scale=True, desc="ingest")
    # Index entries kept as they are: files not listed this time (or filtered out) that still exist.
    listed = {absp[f] for f in order}
    by_str = {str(f): f for f in order}
    new_files = {k: v for k, v in idx["files"].items() if k not in listed and Path(k).exists()}
    new_folders: dict[str, str] = {}
    jobs_list = []
    for folder in sorted(by_dir):
        fs = by_dir[folder]
        ag = sorted(agents.get(project_dir(fs[0]), []))
        fsig = ix.digest(
            [[(str(f), entries[f]["size"], entries[f]["mtime_ns"], base_id[f]) for f in fs], ag, options]
        )
        new_folders[str(folder)] = fsig
        clean = (
            prev.usable
            and idx["folders"].get(str(folder)) == fsig
            and all(status[f] == "unchanged" and "ranges" in entries[f] for f in fs)
        )
        files_in = [(str(f), entries[f], status[f], base_id[f]) for f in fs]
        job = FolderJob(str(out), files_in, ag, clean, prev.usable, options, idx.get("outputs"), kw)
        jobs_list.append(job)
    with (
        atomic_open(out / "states.jsonl", "wb", encoding=None) as sfh,
        atomic_open(out / "traces.jsonl", "wb", encoding=None) as tfh,
        atomic_open(out / "sessions.jsonl", "wb", encoding=None) as cfh,
    ):
        sfh.write(_json.dumps(header(STATES_FORMAT, out, store_id, out / "states.jsonl")) + b"\n")
        tfh.write(_json.dumps(header(EXAMPLES_FORMAT, out, store_id, out / "traces.jsonl")) + b"\n")
        fhs = {"states.jsonl": sfh, "traces.jsonl": tfh, "sessions.jsonl": cfh}
        for results in _run_jobs(jobs_list, jobs if token_counter is None else 1):
            for r in results:
                f, e = by_str[r.path], r.entry
                if bar is not None and r.status != "unchanged":
                    bar.update(e["size"])
                if r.error is not None:
                    total.add(failed(IngestionStats(n_files=1), r.error))
                    per_file[f] = {"file": str(f), "error": r.error}
                    continue
                if r.rows is None:
                    e["ranges"] = {n: prev.copy(n, e["ranges"][n], fhs[n]) for n in _OUTPUTS}
                else:
                    e["ranges"] = {n: _write(fhs[n], r.rows[n]) for n in _OUTPUTS}
                e["ranges_of"] = store_id
                fst = e["stats"]
                total.add(fst)
                row = {"file": str(f), "format": e["format"], "status": r.status,
                       "states": fst.get("n_states_emitted", 0), "examples": fst.get("n_examples", 0),
                       "tool_errors": fst.get("n_tool_errors", 0), "bad_lines": fst.get("skipped_truncated_lines", 0)}  # fmt: skip
                if fst.get("bad_lines"):
                    row["first_bad_lines"] = fst["bad_lines"]
                per_file[f] = row
                new_files[absp[f]] = e
    prev.close()
    if bar is not None:
        bar.close()
    total.finish()
    store_meta = {
        "format": "composer-replication/ingest",
        "version": FORMAT_VERSION,
        "store_id": store_id,
        "options": options,
    }
    atomic_write_json(out / "store.json", store_meta)
    sizes = {n: (out / n).stat().st_size for n in _OUTPUTS}
    ix.save_index(
        out,
        {
            **idx,
            "files": {k: seal(e) for k, e in new_files.items()},
            "folders": new_folders,
            "outputs": store_id,
            "output_sizes": sizes,
        },  # fmt: skip
    )
    _prune_parts(out, new_files)
    totals = total.to_dict()
    for k in ("bad_lines", "file_error"):
        totals.pop(k, None)
    result = {"store_id": store_id, "out_dir": str(out), "totals": {**totals, "n_files_skipped": len(skipped)},
              "filters": {k: v for k, v in filters.describe().items() if v}, "files": [per_file[f] for f in files if f in per_file],
              "skipped": skipped}  # fmt: skip
    with atomic_open(out / "ingest_stats.json", "wb", encoding=None) as fh:
        fh.write(_json.dumps_pretty(result) + b"\n")
    return result


def _not_subagent(f: Path, root: Path) -> bool:
    """``find`` filter: not a subagent transcript (``agent-*.jsonl`` or under a ``subagents`` folder)."""
    if f.name.startswith("agent-"):
        return False
    rel = str(f)[len(str(root)) :]
    return f"{os.sep}subagents{os.sep}" not in rel


def _write(fh: Any, data: bytes) -> list[int]:
    start = fh.tell()
    fh.write(data)
    return [start, fh.tell()]


def _run_jobs(jobs_list: list[FolderJob], jobs: int) -> Iterable[list[FileResult]]:
    """Folder results in folder order: in this process, or from ``jobs`` forked worker processes (fork: a
    worker never re-imports the caller's ``__main__``; it runs only this package's pure-Python parsing)."""
    busy = [j for j in jobs_list if not j.clean]
    if jobs <= 1 or len(busy) < 2:
        yield from map(process_folder, jobs_list)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(busy)), mp_context=ctx) as pool:
        futures = {id(j): pool.submit(process_folder, j) for j in busy}
        for j in jobs_list:  # clean folders only copy rows: done here, in order with the others
            yield futures[id(j)].result() if id(j) in futures else process_folder(j)


def _outputs_match(out: Path, idx: dict[str, Any]) -> bool:
    """The outputs on disk are the ones the index describes (a crash between the renames would break that)."""
    sizes = idx.get("output_sizes") or {}
    try:
        same = all((out / n).stat().st_size == sizes.get(n) for n in _OUTPUTS)
    except OSError:
        return False
    return (
        same
        and bool(idx.get("outputs"))
        and _head_id(out / "states.jsonl") == idx["outputs"] == _head_id(out / "traces.jsonl")
    )


def _head_id(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            return _json.loads(fh.readline()).get("store_id")
    except (OSError, ValueError, AttributeError, _json.JSONDecodeError):
        return None


def _prune_parts(out: Path, files: dict[str, Any]) -> None:
    """Delete the parts of files that are gone (deleted sessions leave the store)."""
    live = {e["part"] for e in files.values()}
    for p in (out / "parts").iterdir():
        if p.name.split(".")[0] not in live:
            p.unlink(missing_ok=True)
