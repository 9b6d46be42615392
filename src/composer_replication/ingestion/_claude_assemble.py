"""Claude Code, phase 2: a file's items -> conversations.

* records repeated by a resumed session are dropped by ``uuid`` (``inputs.drop`` marks those already seen in
  an earlier file of the project folder);
* the active branch of an edited/rewound session is found by walking ``parentUuid`` up from the last turn
  (through ``logicalParentUuid`` at compaction boundaries); other branches are dropped and counted; parallel
  tool calls that fork the tree are kept;
* one API response written as several ``assistant`` records (same ``message.id``) becomes one turn;
* ``compact_boundary`` starts a new segment whose history opens with the compaction summary;
* tool results are paired with their calls; context (isMeta, attachments) stays where it was injected;
* sidechains (inline ``isSidechain``, subagent transcripts, ``agent_progress`` records) are skipped by
  default, or become conversations of their own linked to the parent's Task/Agent call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication.ingestion._base import AssemblyInputs
from composer_replication.ingestion._session import (
    Block,
    Conversation,
    Event,
    IngestionStats,
    tool_error_meta,
)

_CHAT = ("user", "assistant")
_SPAWN_TOOLS = frozenset({"Task", "Agent"})


def is_subagent_path(path: Path) -> bool:
    return path.name.startswith("agent-") or "subagents" in path.parts


def conversations(
    ing: Any, path: Path, items: list[dict[str, Any]], stats: IngestionStats, inputs: AssemblyInputs
) -> list[Conversation]:
    local: set[str] = set()
    kept: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        if i in inputs.drop:
            stats.n_duplicates += 1
            continue
        u = it.get("u")
        if u is not None:
            if u in local:
                stats.n_duplicates += 1
                continue
            local.add(u)
        kept.append(it)
    chat = [it for it in kept if it["t"] in _CHAT]
    groups: list[tuple[list[dict[str, Any]], str, dict[str, Any]]] = []
    if is_subagent_path(path) or (chat and all(it.get("sc") for it in chat)):
        if ing.skip_sidechain:
            stats.skipped_subagent += len(chat)
            return []
        groups.append((kept, "", {**inputs.link, "sidechain": True}))
    else:
        main = [it for it in kept if not it.get("sc")]
        side = [it for it in kept if it.get("sc")]
        groups.append((_active_branch(main, stats), "", {}))
        if side:
            if ing.skip_sidechain:
                stats.skipped_subagent += sum(1 for it in side if it["t"] in _CHAT)
            else:
                groups.extend(_sidechain_groups(side, main))
    convs: list[Conversation] = []
    for n, (g, suffix, meta) in enumerate(groups):
        segs = _events(g, stats)
        if any(segs):
            conv = Conversation([s for s in segs if s], suffix, {**meta, **_conv_meta(g)})
            convs.append(conv)
            stats.n_subagent_runs += int(n > 0)
    if not ing.skip_sidechain:
        for conv in _progress_runs(kept, inputs, stats):
            convs.append(conv)
            stats.n_subagent_runs += 1
    if convs and convs[0].suffix == "":
        convs[0].meta.update(_file_meta(kept))
        subs = [
            {"agent_id": ev.agent_id, "tool_use_id": ev.tool_use_id}
            for seg in convs[0].segments
            for ev in seg
            if ev.kind == "tool" and ev.agent_id
        ]
        if subs:
            convs[0].meta["subagents"] = subs
    return convs


def _conv_meta(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Start/end time and token-usage totals of one conversation's records."""
    ts = [it["ts"] for it in items if "ts" in it]
    out: dict[str, Any] = {"start": min(ts), "end": max(ts)} if ts else {}
    best: dict[tuple[str, str], list[int]] = {}
    for it in items:
        us = it.get("us")
        if us is not None:  # one response is logged several times with growing usage: keep the largest
            key = (it.get("m", ""), it.get("rq", ""))
            if key not in best or sum(us) > sum(best[key]):
                best[key] = us
    if best:
        tot = [sum(v[i] for v in best.values()) for i in range(4)]
        out["usage"] = dict(
            zip(
                ("input_tokens", "output_tokens", "cache_creation_tokens", "cache_read_tokens"),
                tot,
                strict=True,
            )
        )
    return out


def _file_meta(items: list[dict[str, Any]]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    titles: dict[str, str] = {}
    for it in items:
        m = it.get("meta")
        if m:
            for k, v in m.items():
                meta.setdefault("session_id" if k == "sid" else k, v)
        ti = it.get("ti")
        if ti:
            titles[ti[0]] = ti[1]  # the last of each kind wins
    title = titles.get("custom") or titles.get("ai") or titles.get("summary")
    if title:
        meta["title"] = title
    return meta


def _active_branch(recs: list[dict[str, Any]], stats: IngestionStats) -> list[dict[str, Any]]:
    """Items on the branch that ends at the last turn, plus parallel-call siblings of that branch."""
    by_uuid = {it["u"]: it for it in recs if "u" in it}
    leaf: dict[str, Any] | None = None
    # An index loop, not reversed(recs): mypyc 2.4 fails on that (docs/benchmarks/ingestion.md, fourth pass).
    for i in range(len(recs) - 1, -1, -1):
        if recs[i]["t"] in _CHAT and "u" in recs[i]:
            leaf = recs[i]
            break
    if leaf is None or not by_uuid:
        return recs
    chain: set[str] = set()
    node: dict[str, Any] | None = leaf
    while node is not None and node["u"] not in chain:
        chain.add(node["u"])
        parent = node.get("p") or node.get("lp")
        node = by_uuid.get(parent) if parent is not None else None
    msg_ids = {it.get("m") for it in recs if it.get("u") in chain and it["t"] == "assistant"}
    out: list[dict[str, Any]] = []
    tool_ids: set[str] = set()
    for it in recs:
        uid = it.get("u")
        t = it["t"]
        keep = uid is None or uid in chain
        if not keep and t == "assistant" and it.get("m") in msg_ids:
            keep = True
        if not keep and t == "user":
            ids = {e["id"] for e in it.get("e", ()) if e["k"] == "r"}
            keep = bool(ids) and ids <= tool_ids
        if keep:
            out.append(it)
            if t == "assistant":
                tool_ids.update(b["id"] for b in it.get("b", ()) if b["k"] == "tool_use")
        elif t in _CHAT:
            stats.n_off_branch += 1
    return out


def _events(recs: list[dict[str, Any]], stats: IngestionStats) -> list[list[Event]]:
    segments: list[list[Event]] = [[]]
    calls: dict[str, Block] = {}
    for it in recs:
        stats.n_records_used += _record(it, segments, calls, stats)
    return segments


def _record(
    it: dict[str, Any], segments: list[list[Event]], calls: dict[str, Block], stats: IngestionStats
) -> int:
    """Add one item's events; returns 1 if the record was used, else 0."""
    if it.get("cb"):
        stats.n_compactions += 1
        if segments[-1]:
            segments.append([])
        return 1
    t = it["t"]
    if "ad" in it:
        stats.attachments_left_out[it["ad"]] = stats.attachments_left_out.get(it["ad"], 0) + 1
        return 0
    if it.get("x") or not ("b" in it or "e" in it or "s" in it):
        return 0
    seg = segments[-1]
    if t == "assistant":
        blocks = []
        for b in it["b"]:
            if b["k"] == "tool_use":
                stats.n_tool_use_blocks += 1
                blk = Block("tool_use", name=b["n"], input=b["i"], id=b["id"])
                calls[blk.id] = blk
            elif b["k"] == "thinking":
                stats.n_thinking_blocks += 1
                blk = Block("thinking", b["t"])
            else:
                stats.n_text_blocks += 1
                blk = Block("text", b["t"])
            blocks.append(blk)
        last = next((e for e in reversed(seg) if e.kind not in ("tool", "context")), None)
        if last is not None and last.kind == "assistant" and last.key == it["m"]:
            assert last.blocks is not None
            last.blocks.extend(blocks)
        else:
            seg.append(Event("assistant", blocks=blocks, key=it["m"]))
        return 1
    if "s" in it:
        if seg:
            segments.append([])
        segments[-1].append(Event("user", text=it["s"]))
        return 1
    for e in it["e"]:
        k = e["k"]
        if k == "r":
            seg.append(_tool_event(e, calls, stats))
            seg[-1].ts = it.get("ts", "")
        elif k == "c":
            stats.n_context += 1
            seg.append(Event("context", text=e["t"], context_kind=e["c"]))
        else:
            seg.append(Event("user", text=e["t"], ts=it.get("ts", "")))
    return 1


def _tool_event(e: dict[str, Any], calls: dict[str, Block], stats: IngestionStats) -> Event:
    stats.n_tool_results += 1
    tid = e["id"]
    call = calls.get(tid)
    if call is None:
        stats.n_orphan_tool_results += 1
    name = call.name if call else "unknown"
    tool_input = call.input if call else None
    ev = Event(
        "tool", text=e["t"], tool_name=name, tool_use_id=tid, tool_input=tool_input, agent_id=e.get("ag", "")
    )
    if e.get("can"):
        stats.n_cancelled_tool_calls += 1
    if e.get("f"):
        stats.n_tool_errors += 1
        kind = e["ek"]
        ev.error_kind = kind
        ev.error_meta = tool_error_meta(kind, name, e["t"], tool_input, e.get("c"))
        ev.error = ev.error_meta["error_message"] or "(empty error output)"
    return ev


def _first_user_text(items: list[dict[str, Any]]) -> str:
    for it in items:
        for e in it.get("e", ()):
            if e["k"] == "u":
                return e["t"]
    return ""


def _spawn_calls(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        b for it in items if it["t"] == "assistant" for b in it.get("b", ()) if b.get("n") in _SPAWN_TOOLS
    ]


def _sidechain_groups(
    side: list[dict[str, Any]], main: list[dict[str, Any]]
) -> list[tuple[list[dict[str, Any]], str, dict[str, Any]]]:
    """Inline sidechain records, one group per subagent run (by root of the parent chain), each linked to the
    parent's Task/Agent call whose prompt opened it."""
    parent = {it["u"]: it.get("p") for it in side if "u" in it}
    groups: dict[str, list[dict[str, Any]]] = {}
    for it in side:
        node = it.get("u")
        seen = set()
        while node is not None and parent.get(node) in parent and node not in seen:
            seen.add(node)
            node = parent[node]
        groups.setdefault(str(node), []).append(it)
    spawns = _spawn_calls(main)
    out = []
    for n, g in enumerate(groups.values()):
        agent = next((it["ag"] for it in g if "ag" in it), "")
        prompt = _first_user_text(g)
        call = next((b for b in spawns if isinstance(b["i"], dict) and b["i"].get("prompt") == prompt), None)
        meta: dict[str, Any] = {"sidechain": True}
        if agent:
            meta["agent_id"] = agent
        if call is not None:
            meta["parent_tool_use_id"] = call["id"]
        out.append((g, f"@{agent or f'side{n}'}", meta))
    return out


def _progress_runs(
    kept: list[dict[str, Any]], inputs: AssemblyInputs, stats: IngestionStats
) -> list[Conversation]:
    """Subagent runs embedded in ``agent_progress`` records, for subagents without a transcript file."""
    used = stats.n_records_used  # the progress records themselves were counted (or not) in the main pass
    runs: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    seen: set[str] = set()
    for it in kept:
        ap = it.get("ap")
        if ap is None or ap["a"] in inputs.agents_with_files:
            continue
        inner = ap["it"]
        if "u" in inner:
            if inner["u"] in seen:
                continue
            seen.add(inner["u"])
        runs.setdefault(ap["a"], (ap.get("ptu"), []))[1].append(inner)
    out = []
    for agent, (ptu, items) in runs.items():
        segs = _events(items, stats)
        if any(segs):
            meta = {"sidechain": True, "agent_id": agent, "parent_tool_use_id": ptu, "from": "agent_progress"}
            out.append(
                Conversation([s for s in segs if s], f"@{agent or 'progress'}", {**meta, **_conv_meta(items)})
            )
    stats.n_records_used = used
    return out
