"""The offline trainer on 2 gloo processes (DDP and FSDP2): same trajectory as one process, kill -9 + resume.

A run with N processes and ``grad_accum = g`` trains on the micro-batches, grouped into optimizer steps,
of one process with ``grad_accum = N·g`` (``trainer.distributed.engine``), so their metrics must agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from composer_replication.trainer import checkpoint as ckpt

from ..conftest import tiny_config

CHANNELS = ("loss/total", "loss/lm_ce", "loss/sdpo_jsd", "loss/trace_replay_dpo")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _config(small_data, tmp_path: Path, name: str, *, strategy: str = "ddp", grad_accum: int = 1, **sections):
    sections = {
        "schedule": {
            "max_steps": 6,
            "batch_size": 1,
            "grad_accum": grad_accum,
            "type": "cosine",
            "warmup_steps": 1,
        },
        "distributed": {"strategy": strategy},
        **sections,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(small_data, **sections)))
    return path


def _train(cfg: Path, out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "composer_replication.cli.main", "train", str(cfg), "--out", str(out), *args]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)


def _assert_same_trajectory(got: list[dict], want: list[dict], rel: float) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        # all three channels train at every step
        assert a["lm_ce/tokens"] > 0 and a["sdpo/tokens"] > 0 and a["pref/pairs"] > 0
        assert a["lm_ce/tokens"] == b["lm_ce/tokens"] and a["sdpo/tokens"] == b["sdpo/tokens"]
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=rel)
        assert a["loss/lm_ce"] == pytest.approx(b["loss/lm_ce"], rel=rel)
        # the SDPO and DPO terms pass through zero on a random tiny model: relative to the total
        for key in ("loss/sdpo_jsd", "loss/trace_replay_dpo"):
            assert a[key] == pytest.approx(b[key], rel=rel, abs=rel * b["loss/total"])


@pytest.mark.parametrize(
    "strategy,rel",
    [
        ("ddp", 1e-5),
        pytest.param("fsdp2", 1e-5, marks=pytest.mark.slow),
    ],
)
def test_two_processes_match_one_with_the_same_global_batch(small_data, tmp_path, strategy, rel):
    one = _config(small_data, tmp_path, "one", strategy=strategy, grad_accum=2)
    two = _config(small_data, tmp_path, "two", strategy=strategy, grad_accum=1)
    p1 = _train(one, tmp_path / "one")
    assert p1.returncode == 0, p1.stderr[-3000:]
    p2 = _train(two, tmp_path / "two", "--nproc", "2")
    assert p2.returncode == 0, p2.stderr[-3000:]
    _assert_same_trajectory(
        rows(tmp_path / "two" / "metrics.jsonl"), rows(tmp_path / "one" / "metrics.jsonl"), rel
    )
    # rank 0 alone wrote the metrics, and every rank's checkpoint pieces are there
    latest = ckpt.latest_checkpoint(tmp_path / "two" / "checkpoints")
    assert (latest / "rng-rank1.pt").is_file()
    assert (latest / ckpt.SHARDED).is_dir() == (strategy == "fsdp2")
    assert (tmp_path / "two" / "final" / "config.json").is_file()  # exported from the sharded form too
    assert "vllm serve" in p2.stdout


@pytest.mark.slow
def test_fsdp2_fused_kernels_give_the_unsharded_gradients(small_data):
    """The fused-linear path (what large vocabularies use) reads the head and runs the base model
    directly; under FSDP2 the engine unshards the root for it. Same loss and gradients as one process."""
    worker = Path(__file__).with_name("_fsdp_fused_worker.py")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(worker),
    ]
    p = subprocess.run([*cmd, str(small_data)], env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("{")))
    assert out["path"] == "fused"
    for key in ("lm_ce", "trace_replay_dpo", "total"):
        assert out["got"][key] == pytest.approx(out["want"][key], rel=1e-6)
    assert out["worst_grad_rel"] < 1e-5


@pytest.mark.slow
def test_accelerate_launch_runs_the_same_trajectory(small_data, tmp_path):
    import socket

    one = _config(small_data, tmp_path, "one", grad_accum=2)
    two = _config(small_data, tmp_path, "two", grad_accum=1)
    p1 = _train(one, tmp_path / "one")
    assert p1.returncode == 0, p1.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        "-m", "composer_replication.cli.main", "train", str(two), "--out", str(tmp_path / "two"),
    ]  # fmt: skip
    p2 = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0, p2.stderr[-3000:]
    _assert_same_trajectory(
        rows(tmp_path / "two" / "metrics.jsonl"), rows(tmp_path / "one" / "metrics.jsonl"), 1e-5
    )


def _worker(parent: psutil.Process, rank: int) -> psutil.Process | None:
    for child in parent.children(recursive=True):
        try:
            if (
                child.environ().get("RANK") == str(rank)
                and "composer_replication.cli.main" in child.cmdline()
            ):
                return child
        except psutil.Error:
            continue
    return None


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_kill_one_rank_then_resume_continues_from_the_checkpoint(small_data, tmp_path, strategy):
    schedule = {"max_steps": 12, "batch_size": 1, "type": "cosine", "warmup_steps": 1}
    cfg = _config(small_data, tmp_path, "cfg", strategy=strategy, schedule=schedule)
    reference = tmp_path / "reference"
    p = _train(cfg, reference, "--nproc", "2")
    assert p.returncode == 0, p.stderr[-3000:]

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "composer_replication.cli.main", "train", str(cfg), "--out", str(killed)]
    proc = subprocess.Popen(
        [*cmd, "--nproc", "2"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step-00000004").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    victim = _worker(parent, 1)
    assert victim is not None
    victim.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, "the run must fail when a rank dies"
    assert "worker failed" in err.decode()
    done = [int(c.name.split("-")[1]) for c in ckpt.list_checkpoints(killed / "checkpoints")]
    assert done and max(done) < 12
    initial = (killed / "initial_metrics.json").stat().st_mtime_ns

    p = _train(cfg, killed, "--nproc", "2", "--resume")
    assert p.returncode == 0, p.stderr[-3000:]
    assert (killed / "initial_metrics.json").stat().st_mtime_ns == initial  # resumed, not restarted
    got, want = rows(killed / "metrics.jsonl"), rows(reference / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 13))
    assert got == want  # deterministic on CPU: every logged float


def test_nproc_above_the_devices_fails_before_any_model_loads(small_data, tmp_path, capsys, monkeypatch):
    from composer_replication.cli.main import main
    from composer_replication.trainer.offline import loop as offline

    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    cfg = _config(small_data, tmp_path, "cfg")
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--nproc", "4096"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--nproc 4096 is more than the" in err and ("CPU core" in err or "CUDA device" in err)
    assert not (tmp_path / "run").exists()


def test_missing_rendezvous_fails_with_one_line_before_any_model_loads(
    small_data, tmp_path, capsys, monkeypatch
):
    from composer_replication.cli.main import main
    from composer_replication.trainer.offline import loop as offline

    monkeypatch.setattr(offline, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    cfg = _config(small_data, tmp_path, "cfg", distributed={"strategy": "ddp", "rendezvous_timeout_s": 1.5})
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "MASTER_ADDR, MASTER_PORT not set" in err and "torchrun" in err

    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    start = time.monotonic()
    assert main(["train", str(cfg), "--out", str(tmp_path / "run")]) == 1
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"no rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in err


def test_fsdp2_with_on_policy_sdpo_is_refused_before_the_rendezvous(small_data, monkeypatch):
    from composer_replication.config import build_config
    from composer_replication.trainer.distributed import engine as distributed
    from composer_replication.trainer.distributed.launch import LaunchError

    cfg = build_config(
        tiny_config(
            small_data,
            loss={"sdpo": {"weight": 1.0, "source": "on_policy"}},
            distributed={"strategy": "fsdp2"},
        )
    )
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError, match="on_policy .* use distributed.strategy ddp"):
        distributed.setup(cfg)


@pytest.fixture(scope="module")
def smollm2_shaped(tmp_path_factory) -> Path:
    """A tiny model of SmolLM2's architecture (Llama, tied embeddings) with the offline tokenizer."""
    from composer_replication.models import build_tiny_model, build_tiny_tokenizer, save_tiny_pair

    tok = build_tiny_tokenizer(2048)
    model = build_tiny_model(tokenizer=tok, arch="llama", num_hidden_layers=3, seed=3)
    return save_tiny_pair(tmp_path_factory.mktemp("smollm2-shaped"), model, tok)


def test_two_processes_match_one_with_on_policy_sdpo(small_data, smollm2_shaped, tmp_path):
    """The demo's recipe (on-policy SDPO, the default; a LoRA on the last layers; DPO with RPO) on 2
    processes follows one process at ``grad_accum 2``: each rank keys its samples by the global
    micro-batch index, so both runs draw the same samples and train the same adapter."""
    from safetensors.torch import load_file

    sections = dict(
        model={"path": str(smollm2_shaped)},
        loss={"sdpo": {"weight": 1.0, "source": "on_policy", "on_policy": {"max_new_tokens": 8}},
              "preference": {"weight": 0.03}},
        lora={"enabled": True, "r": 4, "alpha": 8, "target_modules": r".*\.layers\.(1|2)\.(self_attn|mlp)\.\w+_proj"},
    )  # fmt: skip
    schedule = {"max_steps": 4, "batch_size": 1, "type": "cosine", "warmup_steps": 1}
    one = _config(small_data, tmp_path, "one", schedule={**schedule, "grad_accum": 2}, **sections)
    two = _config(small_data, tmp_path, "two", schedule={**schedule, "grad_accum": 1}, **sections)
    p1 = _train(one, tmp_path / "one")
    assert p1.returncode == 0, p1.stderr[-3000:]
    p2 = _train(two, tmp_path / "two", "--nproc", "2")
    assert p2.returncode == 0, p2.stderr[-3000:]
    got, want = rows(tmp_path / "two" / "metrics.jsonl"), rows(tmp_path / "one" / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
    for a, b in zip(got, want):
        assert a["sdpo/sample_tokens"] == b["sdpo/sample_tokens"] > 0  # the same samples were drawn
        for key in ("loss/total", "loss/lm_ce", "loss/sdpo_jsd", "loss/trace_replay_dpo"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    w1 = load_file(tmp_path / "one" / "final" / "adapter_model.safetensors")
    w2 = load_file(tmp_path / "two" / "final" / "adapter_model.safetensors")
    assert w1.keys() == w2.keys() and w1
    worst = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert worst < 1e-5, f"adapters differ by up to {worst}"
