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
    run = _Run(out, files, skipped, filters, options, parse_opts, kw, jobs if token_counter is None else 1)
    with directory_lock(out, "ingest output folder"):
        return run.go(force, progress)


class _Run:
    """One ingest run, while this process holds the output folder's lock: decide per file what to redo
    (:meth:`plan`), order the chosen files and cut them into folder jobs (:meth:`jobs`), run the jobs and
    write the outputs (:meth:`write`), then save the store's metadata, the index and the stats
    (:meth:`finish`)."""

    def __init__(
        self, out: Path, files: list[Path], skipped: list[dict[str, str]], filters: Filters,
        options: dict[str, Any], parse_opts: dict[str, Any], kw: dict[str, Any], workers: int,
    ) -> None:  # fmt: skip
        self.out, self.files, self.skipped, self.filters = out, files, skipped, filters
        self.options, self.parse_opts, self.kw, self.workers = options, parse_opts, kw, workers
        self.total = IngestionStats()
        self.absp: dict[Path, str] = {}
        self.per_file: dict[Path, dict[str, Any]] = {}
        self.entries: dict[Path, dict[str, Any]] = {}
        self.status: dict[Path, str] = {}
        self.new_files: dict[str, dict[str, Any]] = {}
        self.new_folders: dict[str, str] = {}
        self.store_id = ""

    def go(self, force: bool, progress: bool) -> dict[str, Any]:
        self.idx = check_index(ix.load_index(Path("/nonexistent") if force else self.out, self.parse_opts))
        self.plan()
        chosen = [f for f in self.entries if self.filters.keep(f, self.entries[f])]
        self.total.n_sessions_filtered = len(self.entries) - len(chosen)
        by_dir, order = self.order(chosen)
        self.prev = _Previous(self.out, _outputs_match(self.out, self.idx))
        drop_bad_ranges(self.entries.values(), self.prev.old, self.idx["outputs"])
        (self.out / "parts").mkdir(parents=True, exist_ok=True)
        # Index entries kept as they are: files not listed this time (or filtered out) that still exist.
        listed = {self.absp[f] for f in order}
        self.new_files = {k: v for k, v in self.idx["files"].items() if k not in listed and Path(k).exists()}
        self.bar = _progress_bar(
            progress, sum(self.entries[f]["size"] for f in order if self.status[f] != "unchanged")
        )
        try:
            self.write(self.jobs(by_dir, chosen), {str(f): f for f in order})
        finally:
            self.prev.close()
            if self.bar is not None:
                self.bar.close()
        return self.finish()

    # -- step 1: what to redo, per file ---------------------------------------------------------------------

    def plan(self) -> None:
        """Per listed file: unchanged (size and mtime as indexed), appended (grew, fingerprint still there),
        rewritten, new, or failed (cannot be read: counted and named)."""
        from composer_replication.ingestion.redact import Redactor

        scrub = Redactor(enabled=self.kw["redact"]).redact  # the index keeps the cwd as the items do
        for f in self.files:
            key = self.absp[f] = os.path.abspath(f)
            old = self.idx["files"].get(key)
            try:
                st = f.stat()
                if old and old["size"] == st.st_size and old["mtime_ns"] == st.st_mtime_ns:
                    self.entries[f], self.status[f] = old, "unchanged"
                    continue
                info = head_info(f, read_session_bytes(f, 65536))
            except (SessionFileError, OSError) as exc:
                gone = f"{f}: no such file (deleted or moved after it was listed?)"
                self._failed(f, str(exc) if isinstance(exc, SessionFileError) else gone)
                continue
            if "cwd" in info:
                info["cwd"] = scrub(info["cwd"])
            e = {"part": ix.part_name(key), "size": st.st_size, "mtime_ns": st.st_mtime_ns, **info}
            self.entries[f], self.status[f] = _changed(f, old, e)

    def _failed(self, f: Path, msg: str) -> None:
        self.total.add(failed(IngestionStats(n_files=1), msg))
        self.per_file[f] = {"file": str(f), "error": msg}

    # -- step 2: order, trace ids, folder jobs ---------------------------------------------------------------

    def order(self, chosen: list[Path]) -> tuple[dict[Path, list[Path]], list[Path]]:
        """The chosen files per project folder, by first timestamp (resumed-session duplicates are dropped
        against earlier files), the folders in name order; the store id of this set of inputs."""
        by_dir: dict[Path, list[Path]] = {}
        for f in chosen:
            by_dir.setdefault(f.parent, []).append(f)
        for fs in by_dir.values():
            fs.sort(key=lambda p: (self.entries[p].get("first_ts", ""), p.name))
        order = [f for d in sorted(by_dir) for f in by_dir[d]]
        inputs = [(self.absp[f], self.entries[f]["size"], self.entries[f]["mtime_ns"]) for f in order]
        self.store_id = ix.digest([FORMAT_VERSION, self.options, inputs])
        return by_dir, order

    def jobs(self, by_dir: dict[Path, list[Path]], chosen: list[Path]) -> list[FolderJob]:
        """One job per project folder; a folder whose files and options did not change is "clean" (every
        row is copied from the previous outputs)."""
        base_id = _trace_ids(chosen, self.absp)
        agents: dict[Path, list[str]] = {}
        if not self.kw["skip_sidechain"]:
            for f in chosen:
                if f.name.startswith("agent-"):
                    agents.setdefault(project_dir(f), []).append(f.stem[len("agent-") :])
        out = []
        for folder in sorted(by_dir):
            fs = by_dir[folder]
            ag = sorted(agents.get(project_dir(fs[0]), []))
            files_in = [(str(f), self.entries[f], self.status[f], base_id[f]) for f in fs]
            fsig = ix.digest(
                [[(p, e["size"], e["mtime_ns"], b) for p, e, _, b in files_in], ag, self.options]
            )
            self.new_folders[str(folder)] = fsig
            clean = (
                self.prev.usable
                and self.idx["folders"].get(str(folder)) == fsig
                and all(self.status[f] == "unchanged" and "ranges" in self.entries[f] for f in fs)
            )
            out.append(FolderJob(str(self.out), files_in, ag, clean, self.prev.usable, self.options,
                                 self.idx.get("outputs"), self.kw))  # fmt: skip
        return out

    # -- step 3: run the jobs, write the outputs -------------------------------------------------------------

    def write(self, jobs_list: list[FolderJob], by_str: dict[str, Path]) -> None:
        out = self.out
        with (
            atomic_open(out / "states.jsonl", "wb", encoding=None) as sfh,
            atomic_open(out / "traces.jsonl", "wb", encoding=None) as tfh,
            atomic_open(out / "sessions.jsonl", "wb", encoding=None) as cfh,
        ):
            sfh.write(_json.dumps(header(STATES_FORMAT, out, self.store_id, out / "states.jsonl")) + b"\n")
            tfh.write(_json.dumps(header(EXAMPLES_FORMAT, out, self.store_id, out / "traces.jsonl")) + b"\n")
            fhs = {"states.jsonl": sfh, "traces.jsonl": tfh, "sessions.jsonl": cfh}
            for results in _run_jobs(jobs_list, self.workers):
                for r in results:
                    self._take(by_str[r.path], r, fhs)

    def _take(self, f: Path, r: FileResult, fhs: dict[str, Any]) -> None:
        """One file's result: its rows written (or copied), its counters added, its index entry kept."""
        e = r.entry
        if self.bar is not None and r.status != "unchanged":
            self.bar.update(e["size"])
        if r.error is not None:
            self._failed(f, r.error)
            return
        if r.rows is None:
            e["ranges"] = {n: self.prev.copy(n, e["ranges"][n], fhs[n]) for n in _OUTPUTS}
        else:
            e["ranges"] = {n: _write(fhs[n], r.rows[n]) for n in _OUTPUTS}
        e["ranges_of"] = self.store_id
        fst = e["stats"]
        self.total.add(fst)
        row = {"file": str(f), "format": e["format"], "status": r.status,
               "states": fst.get("n_states_emitted", 0), "examples": fst.get("n_examples", 0),
               "tool_errors": fst.get("n_tool_errors", 0), "bad_lines": fst.get("skipped_truncated_lines", 0)}  # fmt: skip
        if fst.get("bad_lines"):
            row["first_bad_lines"] = fst["bad_lines"]
        self.per_file[f] = row
        self.new_files[self.absp[f]] = e

    # -- step 4: the store's metadata, the index, the stats ---------------------------------------------------

    def finish(self) -> dict[str, Any]:
        out = self.out
        self.total.finish()
        meta = {"format": "composer-replication/ingest", "version": FORMAT_VERSION, "store_id": self.store_id,
                "options": self.options}  # fmt: skip
        atomic_write_json(out / "store.json", meta)
        sizes = {n: (out / n).stat().st_size for n in _OUTPUTS}
        files = {k: seal(e) for k, e in self.new_files.items()}
        index = {**self.idx, "files": files, "folders": self.new_folders, "outputs": self.store_id,
                 "output_sizes": sizes}  # fmt: skip
        ix.save_index(out, index)
        _prune_parts(out, self.new_files)
        totals = self.total.to_dict()
        for k in ("bad_lines", "file_error"):
            totals.pop(k, None)
        result = {
            "store_id": self.store_id, "out_dir": str(out),
            "totals": {**totals, "n_files_skipped": len(self.skipped)},
            "filters": {k: v for k, v in self.filters.describe().items() if v},
            "files": [self.per_file[f] for f in self.files if f in self.per_file],
            "skipped": self.skipped,
        }  # fmt: skip
        with atomic_open(out / "ingest_stats.json", "wb", encoding=None) as fh:
            fh.write(_json.dumps_pretty(result) + b"\n")
        return result


def _changed(f: Path, old: dict[str, Any] | None, e: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The entry and status of a file that is not unchanged: appended when it grew and the fingerprint of
    its indexed part is still there (parsing resumes), else rewritten (known before) or new."""
    if (
        old
        and old["format"] == e["format"]
        and "offset" in old
        and e["size"] >= old["offset"]
        and old.get("tail") is not None
    ):
        if old["offset"] > 0 and ix.file_tail_hash(f, old["offset"]) == old["tail"]:
            return {**old, **e, "first_ts": old["first_ts"]}, "appended"
        return e, "rewritten"
    return e, "rewritten" if old else "new"


def _trace_ids(chosen: list[Path], absp: dict[Path, str]) -> dict[Path, str]:
    """Trace ids: the file stem, made unique across folders when two files share one."""
    stems: dict[str, list[Path]] = {}
    for f in chosen:
        stems.setdefault(f.stem, []).append(f)
    return {
        f: f.stem if len(fs) == 1 else f"{f.stem}~{ix.part_name(absp[f])[:8]}"
        for fs in stems.values()
        for f in fs
    }


def _progress_bar(progress: bool, todo: int) -> Any:
    if not progress:
        return None
    from tqdm import tqdm

    return tqdm(total=todo, unit="B", unit_scale=True, desc="ingest")


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
