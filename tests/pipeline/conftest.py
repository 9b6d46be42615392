"""Fixtures for the pipeline tests: a loopback OpenAI-compatible teacher server and a reduced run config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# the `tasks` section's stages: disabled in runs without one (the other stages all run)
TASK_STAGES = ("mine_tasks", "eval_tasks_before", "eval_tasks_after")
SESSIONS = REPO / "tests" / "data" / "sessions"
AGREED = '[TOOL_USE] name=Bash input={"command": "git status"}'
COST_PER_CALL = 0.00125


class TeacherServer:
    """Speaks the chat-completions subset teacher replay uses. Teachers whose model name starts with
    ``agree`` all give the same action; ``dissent`` gives prose. Every request is counted per model."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                model = body["model"]
                with server.lock:
                    server.calls[model] += 1
                text = AGREED if model.startswith("agree") else "Let me look at the error message again."
                out = json.dumps({
                    "id": "x", "object": "chat.completion", "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110, "cost": COST_PER_CALL},
                }).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def teacher_server():
    s = TeacherServer()
    yield s
    s.close()


def reduced_config(tmp_path: Path, server_url: str, **over) -> Path:
    """A run config over three small real sessions with the tiny model, loopback teachers, few steps."""
    src = tmp_path / "sessions"
    src.mkdir(exist_ok=True)
    for f in ("claude_code/marot__spotter__short.jsonl",
              "claude_code/d-kimuson__claude-code-viewer__5c0375b4-57a5-4f26-b12d-d022ee4e51b7.jsonl",
              "claude_code/iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f.jsonl"):  # fmt: skip
        shutil.copy(SESSIONS / f, src / Path(f).name)
    teachers = [
        {
            "slug": f"test/{m}",
            "model": m,
            "base_url": server_url,
            "input_per_mtok": 1.0,
            "output_per_mtok": 2.0,
        }
        for m in ("agree-a", "agree-b", "dissent")
    ]
    cfg = {
        "student": {"name": "tiny"},
        "sources": {"paths": ["sessions"], "heldout_traces": ["iansherr__claude-code-log__326189cf-5676-4237-8cde-1ce80aae4a9f"]},
        "replay": {"teachers": teachers, "max_total_usd": 1.0, "max_tokens": 32, "history_messages": 4, "concurrency": 1},
        "normalize": {"skip_dj": True},
        "train": {"data": {"max_seq_len": 128, "max_dpo_seq_len": 96}, "schedule": {"max_steps": 2, "batch_size": 1},
                  "checkpoint": {"every_steps": 1}, "logging": {"plot": False, "progress": False},
                  "grpo": {"num_generations": 2, "max_completion_length": 8}},
        "grpo": {"enabled": True, "max_steps": 1, "tasks": ["off_by_one"]},
        "evaluate": {"max_sites": 2, "max_new_tokens": 8, "max_prompt_tokens": 128, "sandbox_max_turns": 1,
                     "sandbox_max_new_tokens": 8},
    }  # fmt: skip
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real console entry point in a fresh process (as a user would)."""
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "composer_replication.cli.main", *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
