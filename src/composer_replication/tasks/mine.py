"""``tasks mine``: sessions -> episodes -> validated tasks, with a report of every drop.

For each selected session (`tasks.sessions`): find its repository (`repo.locate`), cut it into episodes
(`episodes`), draft each episode's task (`build`: starting commit and files, replayed reference, checks,
environment), write it to ``TASKS/.staging/NAME`` (`layout`), load it back with the project's task
loader, validate it in the sandbox (`validate`) and move it into place. ``TASKS/report.json`` lists
sessions -> episodes -> tasks and every dropped episode with its reason; each drop also prints one line.

Incremental: ``TASKS/mined.json`` holds each episode's digest (its draft: instruction, files, reference,
checks, environment) and outcome. A re-run reuses a validated task whose digest and folder are unchanged
and a drop whose digest is unchanged (except drops a later run may not repeat: a sandbox or environment
failure), and mines only what is new. It is written after every episode, so a crash loses nothing.
One process at a time per ``TASKS`` directory (`_lock.directory_lock`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from composer_replication._io import atomic_write_json
from composer_replication._lock import directory_lock
from composer_replication.datagen.tasks import load_task
from composer_replication.ingestion.redact import Redactor
from composer_replication.tasks import layout
from composer_replication.tasks.build import Built, Dropped, Options, SessionState, build, task_name
from composer_replication.tasks.environment import sandbox_spec
from composer_replication.tasks.episodes import episodes, turns
from composer_replication.tasks.repo import locate
from composer_replication.tasks.sessions import SessionLog, read_sessions
from composer_replication.tasks.validate import validate

INDEX = "mined.json"
REPORT = "report.json"
MINER_VERSION = 1
_RETRY = {"sandbox failed", "environment build failed"}


def mine_tasks(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    *,
    since: Any = None,
    until: Any = None,
    project: Any = None,
    session: Any = None,
    options: Options | None = None,
    sandbox: Any = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Mine ``paths`` into ``out_dir`` (module docstring) and return the report."""
    out = Path(out_dir)
    opts = options or Options()
    say = log or (lambda line: print(line, file=sys.stderr))
    with directory_lock(out, "tasks directory"):
        logs, skipped = read_sessions(list(paths), since=since, until=until, project=project, session=session)
        index = _load_index(out)
        report: dict[str, Any] = {"sessions": [], "skipped_files": skipped}
        for s in logs:
            report["sessions"].append(_mine_session(s, out, opts, sandbox, index, say))
        _finish(out, report, index, say)
    return report


def _mine_session(
    s: SessionLog, out: Path, opts: Options, sandbox: Any, index: dict[str, Any], say: Callable[[str], None]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": s.session_id,
        "file": s.path.name,
        "source": s.source,
        "episodes": [],
    }
    if s.error or s.conversation is None:
        row["error"] = s.error
        say(f"{s.path.name}: unreadable session: {s.error}")
        return row
    eps = episodes(turns(s.conversation, s.cwd))
    loc = locate(s.cwd, opts.repo_map)
    if isinstance(loc, str):
        row["error"] = loc
        for ep in eps:
            why = loc[len("no repository: ") :]
            row["episodes"].append(
                _kept(s, ep, out, index, "no repository", why, say)
                or _drop(s, ep.index, ep.turn_range, "no repository", why, say)
            )
        if not eps:
            say(f"session {s.session_id}: {loc} (no episode with file changes either)")
        return row
    row["repository"] = Path(loc.top).name
    state = SessionState(s, loc)
    redactor = Redactor()
    for ep in eps:
        try:
            built = build(state, ep, opts, redactor)
        except Dropped as d:
            row["episodes"].append(
                _kept(s, ep, out, index, d.reason, d.detail, say)
                or _drop(s, ep.index, ep.turn_range, d.reason, d.detail, say)
            )
            continue
        unseen = built.draft.metadata["dirty_at_session_start"]
        if unseen:
            say(
                f"session {s.session_id} turns {ep.turn_range[0]}-{ep.turn_range[1]}: began on uncommitted "
                f"changes to {', '.join(unseen[:3])} (its Read output differs from the starting commit); "
                "kept only if it validates"
            )
        row["episodes"].append(_settle(built, out, sandbox, index, say))
    return row


def _drop(
    s: SessionLog, n: int, turn_range: tuple[int, int], reason: str, detail: str, say: Any
) -> dict[str, Any]:
    say(f"session {s.session_id} turns {turn_range[0]}-{turn_range[1]}: dropped: {reason}: {detail}")
    return {"episode": n, "turns": list(turn_range), "status": "dropped", "reason": reason, "detail": detail}


def _kept(
    s: SessionLog, ep: Any, out: Path, index: dict[str, Any], reason: str, detail: str, say: Any
) -> dict[str, Any] | None:
    """An episode validated by an earlier run that cannot be mined again now (its repository moved, ...):
    its task folder is kept as it is."""
    name = task_name(s.session_id, ep)
    old = index["episodes"].get(name)
    if not (old and old.get("status") == "validated" and _loads(out / name)):
        return None
    say(f"task {name}: kept from an earlier run (cannot be mined again now: {reason}: {detail})")
    row = {"episode": ep.index, "turns": list(ep.turn_range), "task": name, "status": "reused"}
    return {**row, "fail_to_pass": old.get("fail_to_pass", []), "note": f"not re-mined: {reason}"}


def _digest(built: Built) -> str:
    d = built.draft
    blob = json.dumps(
        [MINER_VERSION, d.instruction, sorted(d.files.items()), sorted(d.test_files.items()),
         sorted(d.solution.items()), d.deleted, d.checks, d.environment, d.timeout_s],
        ensure_ascii=False,
    )  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()


def _settle(built: Built, out: Path, sandbox: Any, index: dict[str, Any], say: Any) -> dict[str, Any]:
    d = built.draft
    m = d.metadata
    row = {"episode": m["episode"], "turns": m["turns"], "task": d.name, "commit": m["commit"]}
    digest = _digest(built)
    old = index["episodes"].get(d.name)
    if old and old.get("digest") == digest:
        if old["status"] == "validated" and _loads(out / d.name):
            return {**row, "status": "reused", "fail_to_pass": old.get("fail_to_pass", [])}
        if old["status"] == "dropped" and old.get("reason") not in _RETRY:
            say(
                f"task {d.name}: dropped (unchanged since the last run): {old['reason']}: {old.get('detail', '')}"
            )
            return {**row, "status": "dropped", "reason": old["reason"], "detail": old.get("detail", "")}
    stage = layout.write_task(out, d)
    try:
        v = validate(load_task(stage), built.reference, sandbox=sandbox_spec(built.env, sandbox))
    except (ValueError, OSError) as e:  # a draft the loader refuses is a miner bug or a hostile repo
        shutil.rmtree(stage, ignore_errors=True)
        v_reason, v_detail = "task folder refused by the loader", str(e)[:300]
        index["episodes"][d.name] = {
            "digest": digest,
            "status": "dropped",
            "reason": v_reason,
            "detail": v_detail,
        }
        say(f"task {d.name}: dropped: {v_reason}: {v_detail}")
        return {**row, "status": "dropped", "reason": v_reason, "detail": v_detail}
    if not v.kept:
        shutil.rmtree(stage, ignore_errors=True)
        index["episodes"][d.name] = {
            "digest": digest,
            "status": "dropped",
            "reason": v.reason,
            "detail": v.detail,
        }
        say(
            f"task {d.name} (session {m['session_id']} turns {m['turns'][0]}-{m['turns'][1]}): dropped: {v.reason}: {v.detail}"
        )
        return {**row, "status": "dropped", "reason": v.reason, "detail": v.detail}
    d.checks = [*v.fail_to_pass, *v.pass_to_pass]
    d.verdict = {
        "fail_to_pass": v.fail_to_pass, "pass_to_pass": v.pass_to_pass, "removed_checks": list(v.removed),
        "tests_fail_to_pass": v.tests_fail_to_pass[:200], "tests_pass_to_pass": v.tests_pass_to_pass[:200],
    }  # fmt: skip
    stage = layout.write_task(out, d)
    layout.publish(stage, out / d.name)
    index["episodes"][d.name] = {"digest": digest, "status": "validated", "fail_to_pass": v.fail_to_pass}
    _save_index(out, index)
    return {**row, "status": "validated", "fail_to_pass": v.fail_to_pass, "pass_to_pass": v.pass_to_pass}


def _loads(path: Path) -> bool:
    try:
        load_task(path)
    except (ValueError, OSError):
        return False
    return True


def _load_index(out: Path) -> dict[str, Any]:
    try:
        data = json.loads((out / INDEX).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"version": MINER_VERSION, "episodes": {}}
    ok = isinstance(data, dict) and isinstance(data.get("episodes"), dict)
    eps = {k: v for k, v in data["episodes"].items() if isinstance(v, dict) and "status" in v} if ok else {}
    return {"version": MINER_VERSION, "episodes": eps}


def _save_index(out: Path, index: dict[str, Any]) -> None:
    atomic_write_json(out / INDEX, index)


def _finish(out: Path, report: dict[str, Any], index: dict[str, Any], say: Callable[[str], None]) -> None:
    eps = [e for s in report["sessions"] for e in s["episodes"]]
    reasons = Counter(e["reason"] for e in eps if e["status"] == "dropped")
    kept = [e for e in eps if e["status"] in ("validated", "reused")]
    report["counts"] = {
        "sessions": len(report["sessions"]),
        "sessions_without_repository": sum(1 for s in report["sessions"] if "error" in s),
        "episodes": len(eps),
        "validated": sum(1 for e in eps if e["status"] == "validated"),
        "reused": sum(1 for e in eps if e["status"] == "reused"),
        "tasks": len(kept),
        "dropped": sum(reasons.values()),
    }
    report["drop_reasons"] = dict(reasons.most_common())
    shutil.rmtree(out / layout.STAGING, ignore_errors=True)
    _save_index(out, index)
    atomic_write_json(out / REPORT, report)
    c = report["counts"]
    say(
        f"{c['sessions']} sessions, {c['episodes']} episodes -> {c['tasks']} tasks "
        f"({c['validated']} new, {c['reused']} reused), {c['dropped']} dropped"
    )
    for reason, n in reasons.most_common():
        say(f"  dropped {n}: {reason}")
