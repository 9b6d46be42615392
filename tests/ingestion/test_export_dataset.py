"""``composer-replication export``: the ingested sessions as an OpenAI tool-calling dataset that TRL's own
``SFTTrainer`` trains on through its tool path, and as Hub agent traces."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from composer_replication import wire

SESSIONS = Path(__file__).parents[1] / "data" / "sessions"
pytest.importorskip("trl")


@pytest.fixture(scope="module")
def ingest_dir(tmp_path_factory) -> Path:
    from composer_replication.ingestion import ingest_paths

    out = tmp_path_factory.mktemp("export-ingest")
    ingest_paths([SESSIONS], out)
    return out


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "composer_replication.cli.main", "export", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_openai_rows_are_the_conversations_with_their_tools(ingest_dir, tmp_path):
    r = _cli(str(ingest_dir), "--out", str(tmp_path / "ds"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "ds" / "train.jsonl").read_text().splitlines()]
    assert f"{len(rows)} conversations (openai)" in r.stderr and len(rows) > 20
    assert {row["source"] for row in rows} == {"claude_code", "codex"}
    for row in rows:
        msgs, names = row["messages"], [t["function"]["name"] for t in row["tools"]]
        assert msgs[0] == {"role": "system", "content": wire.SYSTEM_PROMPT}
        ids = {c["id"]: c for m in msgs for c in m.get("tool_calls") or []}
        for m in msgs:
            assert "is_error" not in m and set(m) <= {"role", "content", "tool_calls", "tool_call_id", "name"}
            for c in m.get("tool_calls") or []:
                assert c["function"]["name"] in names and isinstance(c["function"]["arguments"], dict)
            if m["role"] == "tool":
                assert m["tool_call_id"] in ids  # every result answers a call of the conversation
    # --arguments string: OpenAI's own format, the JSON as text
    assert _cli(str(ingest_dir), "--out", str(tmp_path / "ds2"), "--arguments", "string").returncode == 0
    row = json.loads((tmp_path / "ds2" / "train.jsonl").read_text().splitlines()[0])
    call = next(c for m in row["messages"] for c in m.get("tool_calls") or [])
    assert isinstance(call["function"]["arguments"], str) and json.loads(call["function"]["arguments"])


@pytest.mark.slow  # ~30 s alone: three SFT steps on 1k-token rows (the tool schemas alone are ~1k tokens)
def test_the_export_trains_trls_sfttrainer_through_its_tool_path(ingest_dir, tmp_path, tiny_tokenizer):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from composer_replication.ingestion.export import export_dataset
    from composer_replication.models import build_tiny_model

    export_dataset(ingest_dir, tmp_path / "ds")
    ds = load_dataset("json", data_files=str(tmp_path / "ds" / "train.jsonl"), split="train")
    tok = wire.prepare_tokenizer(copy.deepcopy(tiny_tokenizer))  # the template final/ carries
    with_calls = [i for i in range(len(ds)) if any(m.get("tool_calls") for m in ds[i]["messages"])]
    size = {
        i: len(tok.apply_chat_template(ds[i]["messages"], tools=ds[i]["tools"], tokenize=False))
        for i in with_calls
    }
    ds = ds.select(sorted(with_calls, key=size.__getitem__)[:4])
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3,
                     max_length=1024, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0)  # fmt: skip
    trainer = SFTTrainer(
        model=build_tiny_model(tokenizer=tok, seed=0), args=args, train_dataset=ds, processing_class=tok
    )
    # TRL rendered the tools column and the tool calls into the training tokens
    text = tok.decode(trainer.train_dataset[0]["input_ids"])
    assert "# Tools" in text and '"type": "function"' in text
    assert '<tool_call>\n{"name": "' in text and "<tool_response>" in text
    out = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses) and math.isfinite(out.training_loss)


def test_hub_agent_traces_are_session_trace_files(ingest_dir, tmp_path):
    r = _cli(str(ingest_dir), "--format", "hf-agent-traces", "--out", str(tmp_path / "hub"))
    assert r.returncode == 0, r.stderr
    files = sorted((tmp_path / "hub" / "sessions").rglob("*.jsonl"))
    assert {f.parent.name for f in files} == {"claude_code", "codex"}
    assert "agent-traces" in (tmp_path / "hub" / "README.md").read_text()
    n_results = 0
    for f in files:
        lines = [json.loads(x) for x in f.read_text().splitlines()]
        head, msgs = lines[0], [x["message"] for x in lines[1:]]
        assert head["type"] == "session" and head["harness"] == "composer-replication" and head["id"]
        assert all(x["type"] == "message" for x in lines[1:])
        calls = {c["id"] for m in msgs for c in m.get("toolCalls") or []}
        for m in msgs:
            assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)
            for c in m.get("toolCalls") or []:
                assert isinstance(c["function"]["arguments"], str)  # JSON text, as the format says
            if m["role"] == "tool":
                assert m["toolCallId"] in calls
                n_results += 1
    assert n_results > 100


def test_refused_inputs_are_one_line(ingest_dir, tmp_path):
    r = _cli(str(tmp_path), "--out", str(tmp_path / "x"))  # not an ingest folder
    assert r.returncode == 1 and "no store.json here" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    unredacted = tmp_path / "unredacted"
    from composer_replication.ingestion import ingest_paths

    with pytest.warns(UserWarning, match="redaction is OFF"):
        ingest_paths([SESSIONS / "claude_code" / "marot__spotter__short.jsonl"], unredacted, redact=False)
    r = _cli(str(unredacted), "--out", str(tmp_path / "y"))
    assert r.returncode == 1 and "ingested with redaction off" in r.stderr and not (tmp_path / "y").exists()
    assert _cli(str(unredacted), "--out", str(tmp_path / "y"), "--allow-unredacted").returncode == 0
