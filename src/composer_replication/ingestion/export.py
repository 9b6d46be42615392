"""Ingested sessions as datasets other tools read: ``composer-replication export``.

* ``openai``: ``train.jsonl``, one conversation per line, ``{"messages", "tools", ...}``: OpenAI chat
  messages (assistant ``tool_calls``, ``tool`` results answering them by ``tool_call_id``) and the
  session's function-tool schemas (``tool_schemas``), what TRL's ``SFTTrainer`` (conversational data
  with a ``tools`` column), axolotl's ``chat_template`` datasets and OpenAI's fine-tuning API take. A row
  is one ``episode`` example of the ingest (a human prompt and what followed, cut to the ingest's
  ``example_max_tokens``). ``arguments="object"`` writes call arguments as JSON objects (what Hugging
  Face chat templates render), ``"string"`` as JSON text (OpenAI's own format).
* ``hf-agent-traces``: ``sessions/<source>/<trace>.jsonl``, one conversation per file in the Hub's
  Session Trace Simple Format (a ``session`` header, then one ``message`` line per message), which the
  Hugging Face Hub shows in its agent-trace viewer.

Both are written from the ingest folder, so the redaction ingestion applied is already in them (an
ingest run with redaction off is refused unless ``allow_unredacted``). The output folder is written
beside itself and renamed into place: a crash leaves the previous export or none, never half of one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from composer_replication import wire
from composer_replication._io import swap_in_dir

FORMATS = ("openai", "hf-agent-traces")
HARNESS = "composer-replication"
__all__ = ["FORMATS", "export_dataset"]


def _call_args(msg: dict[str, Any], as_object: bool) -> dict[str, Any]:
    if not as_object or not msg.get("tool_calls"):
        return msg
    calls = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
             for c in msg["tool_calls"]]  # fmt: skip
    return {**msg, "tool_calls": calls}


def _openai_rows(root: Path, system: str, as_object: bool) -> Iterator[dict[str, Any]]:
    from composer_replication.ingestion.store import read_examples

    for ex in read_examples(root / "traces.jsonl"):
        if ex.get("kind") != "episode":
            continue
        msgs, _ = wire.trace_messages(ex, system_prompt=system)
        yield {
            "messages": [_call_args(m, as_object) for m in wire.openai_messages(msgs)],
            "tools": wire.trace_tool_schemas(ex),
            "id": ex["example_id"],
            "source": ex.get("source"),
        }


def _sts_message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": str(m.get("content") or "")}
    if m.get("reasoning_content"):
        out["reasoningContent"] = m["reasoning_content"]
    if m.get("tool_calls"):
        out["toolCalls"] = [{"id": c["id"], "function": c["function"]} for c in m["tool_calls"]]
    if m.get("tool_call_id"):
        out["toolCallId"] = m["tool_call_id"]
    if m.get("is_error"):
        out["isError"] = True
    return {"type": "message", "message": out}


def _write_sessions(root: Path, out: Path, system: str) -> int:
    from composer_replication.ingestion.store import Store

    store = Store(root)
    n = 0
    for trace_id, row in store.catalog.items():
        trace = store.trace(trace_id)
        msgs, _ = wire.turns_to_messages(trace.turns, system)
        head = {"type": "session", "harness": HARNESS, "id": trace_id, "name": row.get("title") or trace_id,
                "source": trace.source, "tools": trace.tool_schemas}  # fmt: skip
        path = (
            out / "sessions" / re.sub(r"[^A-Za-z0-9_]", "_", trace.source) / f"{_file_name(trace_id)}.jsonl"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [head, *(_sts_message(m) for m in msgs)]
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
        n += 1
    return n


def _file_name(trace_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@-]", "_", trace_id)[:200] or "trace"


def _card(fmt: str, n: int) -> str:
    if fmt == "openai":
        front = "configs:\n- config_name: default\n  data_files: train.jsonl\n"
        body = (f"{n} conversations as OpenAI chat messages with tool calls, and the tools each session had "
                "(`messages`, `tools`). Load with `datasets.load_dataset(\"json\", data_files=\"train.jsonl\")`.")  # fmt: skip
    else:
        front = "tags:\n- agent-traces\n"
        body = (
            f"{n} coding-agent sessions in the Session Trace Simple Format, one file each under `sessions/`."
        )
    return f"---\n{front}---\n\n# Coding-agent sessions\n\n{body} Exported by {HARNESS}; secrets redacted at ingest.\n"


def export_dataset(
    ingest_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    fmt: str = "openai",
    arguments: str = "object",
    allow_unredacted: bool = False,
) -> dict[str, Any]:
    """Write the ingest folder ``ingest_dir`` to ``out_dir`` in ``fmt`` (see the module docstring);
    returns ``{"format", "rows", "out"}``."""
    from composer_replication.ingestion.store import Store, _system_prompt

    if fmt not in FORMATS:
        raise ValueError(f"export format {fmt!r}: use one of {', '.join(FORMATS)}")
    if arguments not in ("object", "string"):
        raise ValueError(f"--arguments {arguments!r}: use object or string")
    root, out = Path(ingest_dir), Path(out_dir)
    options = Store(root).meta.get("options") or {}
    if not options.get("redact", True) and not allow_unredacted:
        raise ValueError(
            f"{root}: ingested with redaction off, so secrets may be in it; re-ingest without "
            "--no-redact, or pass --allow-unredacted to export it anyway"
        )
    system = _system_prompt(options.get("system_prompt") or wire.SYSTEM_PROMPT)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if fmt == "openai":
            n = 0
            with open(tmp / "train.jsonl", "w", encoding="utf-8") as fh:
                for row in _openai_rows(root, system, arguments == "object"):
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
        else:
            n = _write_sessions(root, tmp, system)
        (tmp / "README.md").write_text(_card(fmt, n), encoding="utf-8")
        swap_in_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"format": fmt, "rows": n, "out": str(out)}
