"""GRPO at scale: `grpo.vllm` reaches TRL's vLLM generation, bad vLLM settings fail before any model
loads, and the GRPO phase runs under `accelerate launch` with 2 CPU processes."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
import yaml

from composer_replication.config import ConfigError, build_config

from ..conftest import grpo_cfg

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.parametrize(
    "vllm,message",
    [
        ({"mode": "server"}, "grpo.vllm: Value error, server_url None: mode server needs"),
        ({"mode": "server", "server_url": "localhost:8000"}, "mode server needs the vLLM server's http(s)"),
        ({"mode": "colocate", "server_url": "http://h:1"}, "server_url is for mode: server"),
        ({"mode": "remote"}, "grpo.vllm.mode"),
    ],
)
def test_bad_vllm_sections_name_the_field(small_data, vllm, message):
    with pytest.raises(ConfigError) as err:
        build_config(grpo_cfg(small_data, vllm=vllm))
    assert message.replace("Value error, ", "") in str(err.value)


def test_vllm_in_overrides_and_section_clash(small_data):
    with pytest.raises(ConfigError, match=r"overrides \['vllm_mode'\] clash with grpo.vllm"):
        build_config(grpo_cfg(small_data, vllm={"mode": "colocate"}, overrides={"vllm_mode": "server"}))


def test_grpo_vllm_reaches_trls_vllm_generation(small_data):
    """The section becomes GRPOConfig's vLLM fields, and TRL's trainer takes the vLLM path with them."""
    from composer_replication.trainer.grpo.objectives import make_po_config
    from composer_replication.trainer.grpo.scale import grpo_config_kwargs

    cfg = build_config(grpo_cfg(small_data, vllm={"mode": "server", "server_url": "http://10.1.2.3:8011/"}))
    kw = grpo_config_kwargs(cfg)
    args = make_po_config("dr_grpo", output_dir="unused", use_cpu=True, **kw)
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_base_url) == (
        True,
        "server",
        "http://10.1.2.3:8011",
    )
    assert args.vllm_server_timeout == 240.0 and args.ddp_broadcast_buffers is False
    colo = build_config(grpo_cfg(small_data, vllm={"mode": "colocate", "tensor_parallel_size": 2}))
    args = make_po_config("dr_grpo", output_dir="unused", use_cpu=True, **grpo_config_kwargs(colo))
    assert (args.vllm_mode, args.vllm_tensor_parallel_size, args.vllm_gpu_memory_utilization) == (
        "colocate",
        2,
        0.3,
    )
    if HAS_VLLM:
        return
    from datasets import Dataset

    from composer_replication.models import build_tiny_model, build_tiny_tokenizer
    from composer_replication.trainer.composer_trainer import ComposerReplicationTrainer

    tok = build_tiny_tokenizer(2048)
    with pytest.raises(ImportError, match="vLLM is not available and `use_vllm` is set to True"):
        ComposerReplicationTrainer(
            model=build_tiny_model(tokenizer=tok), reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=make_po_config("dr_grpo", output_dir="unused", use_cpu=True, **kw),
            train_dataset=Dataset.from_list([{"prompt": "hi"}]), processing_class=tok,
        )  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_cli(small_data, tmp_path, monkeypatch, vllm):
    from composer_replication.cli.main import main
    from composer_replication.trainer import prepare

    monkeypatch.setattr(prepare, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(grpo_cfg(small_data, vllm=vllm)))
    return main(["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")])


def test_a_vllm_server_that_does_not_answer_fails_before_any_model_loads(
    small_data, tmp_path, capsys, monkeypatch
):
    port = _free_port()
    vllm = {"mode": "server", "server_url": f"http://127.0.0.1:{port}", "server_timeout_s": 1}
    assert _run_cli(small_data, tmp_path, monkeypatch, vllm) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"grpo.vllm.server_url: http://127.0.0.1:{port}/health/ did not answer within 1 s" in err
    assert "trl vllm-serve" in err


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        ok = self.path == "/health/"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}' if ok else b"")

    def log_message(self, *args):
        pass


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_vllm_not_installed_names_the_extra(small_data, tmp_path, capsys, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        vllm = {"mode": "server", "server_url": f"http://127.0.0.1:{server.server_address[1]}"}
        assert _run_cli(small_data, tmp_path, monkeypatch, vllm) == 1
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'composer-replication[vllm]'" in err


def test_colocate_without_a_gpu_fails_before_any_model_loads(small_data, tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert _run_cli(small_data, tmp_path, monkeypatch, {"mode": "colocate"}) == 1
    assert "colocate runs vLLM on each process's GPU, and there is none here" in capsys.readouterr().err


@pytest.mark.slow
def test_grpo_under_accelerate_launch_with_two_cpu_processes(small_data, tmp_path):
    cfg = grpo_cfg(small_data)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()),
        "-m", "composer_replication.cli.main", "train", str(tmp_path / "c.yaml"), "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # rank 0 alone wrote them
    assert any(r.get("sdpo/loss", 0) > 0 for r in rows) or any(r.get("pref/loss", 0) > 0 for r in rows)
    assert (out / "final" / "config.json").is_file() and "vllm serve" in p.stdout
