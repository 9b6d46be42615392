"""Serving ``final/``: ``transformers serve`` on loopback answers ``/v1/chat/completions`` with ``tools``
as OpenAI ``tool_calls``, because the exported tokenizer carries the tool template and the response
template the server parses by (a Llama-architecture model, so no built-in fallback parses for it)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from composer_replication import tool_schemas, wire

for _dep in ("fastapi", "uvicorn", "openai"):  # transformers[serving], the serve extra
    pytest.importorskip(_dep, reason="transformers serve needs the serve extra (fastapi, uvicorn, openai)")

TOOLS = tool_schemas.tools_for("claude_code", ["Bash"])
MESSAGES = [
    {"role": "system", "content": wire.SYSTEM_PROMPT},
    {"role": "user", "content": "List the files in the workspace."},
]
ARGS = {"command": "ls -la"}


def _parrot_final(tmp_path: Path, tok, steps: int = 120) -> Path:
    """A tiny Llama that learned to answer MESSAGES with a Bash call, exported as training exports."""
    import torch

    from composer_replication.models import build_tiny_model
    from composer_replication.trainer.export import export_model

    model = build_tiny_model(tokenizer=tok, arch="llama", seed=0)
    prompt = wire.render(tok, MESSAGES, TOOLS)
    answer = wire.response_text(tok, "On it.\n\n" + wire.format_tool_use("Bash", ARGS), TOOLS)
    ids = tok(prompt + answer + tok.eos_token, add_special_tokens=False, return_tensors="pt")["input_ids"]
    labels = ids.clone()
    labels[:, : len(tok(prompt, add_special_tokens=False)["input_ids"])] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    export_model(model.eval(), tok, tmp_path / "final")
    return tmp_path / "final"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def test_final_carries_the_tool_template_and_a_generation_config(tmp_path, tiny_tokenizer):
    final = _parrot_final(tmp_path, copy.deepcopy(tiny_tokenizer), steps=0)
    cfg = json.loads((final / "tokenizer_config.json").read_text())
    assert cfg["response_template"] == wire.HERMES_RESPONSE_TEMPLATE
    template = (
        (final / "chat_template.jinja").read_text()
        if (final / "chat_template.jinja").exists()
        else cfg["chat_template"]
    )
    assert template == wire.HERMES_TEMPLATE
    gen = json.loads((final / "generation_config.json").read_text())
    eos = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_end|>") in eos


@pytest.mark.slow
def test_transformers_serve_answers_with_tool_calls(tmp_path, tiny_tokenizer):
    exe = shutil.which("transformers") or pytest.skip("no transformers CLI on PATH")
    final = _parrot_final(tmp_path, copy.deepcopy(tiny_tokenizer))
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([exe, "serve", str(final), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
                time.sleep(0.5)
        got = _post(f"{base}/v1/chat/completions", {"model": str(final), "messages": MESSAGES, "tools": TOOLS,
                                                   "temperature": 0, "max_tokens": 64})  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    choice = got["choices"][0]
    msg = choice["message"]
    assert choice["finish_reason"] == "tool_calls", got
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]] == [
        ("Bash", ARGS)
    ]
    # the project reads the served answer as the same action it trained on
    assert wire.parse_openai_message(msg).tool_calls == (("Bash", ARGS),)
    assert (msg.get("content") or "").strip() in ("", "On it.")
    assert sys.executable  # the server ran as its own process, on loopback only
