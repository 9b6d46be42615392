"""Each kill-switch trigger stops a run with a checkpoint, a recorded reason and exit code 3."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from composer_replication.safety import EXIT_KILL_SWITCH, KillSwitch, KillSwitchTriggered


def _log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----------------------------------------------------------------------------- a small training loop
def train_loop(model, switch: KillSwitch, ckpt_dir: Path, *, steps: int = 10, inject=None, lr: float = 1e-2):
    """SGD on the tiny model; observes loss / grad norm / injected metrics; checkpoints and raises on a trigger."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ids = torch.randint(0, 2048, (1, 8))
    for step in range(1, steps + 1):
        extra = inject(step, model) if inject else {}
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
        opt.step()
        opt.zero_grad()
        switch.observe(step=step, loss=out.loss.item(), grad_norm=grad_norm, **extra)
        if (reason := switch.should_stop()) is not None:
            torch.save({"step": step, "model": model.state_dict()}, ckpt_dir / f"checkpoint-{step}.pt")
            raise KillSwitchTriggered(reason)
    return steps


def _poison(step, model):
    if step == 4:
        with torch.no_grad():
            next(model.parameters()).fill_(float("nan"))
    return {}


def _spike(step, model):
    if step == 9:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(50.0)
    return {}


CASES = {
    "nan_loss": (dict(), _poison, "non-finite loss", 4),
    "grad_spike": (dict(grad_spike_factor=5.0, health_window=8), _spike, "grad-norm spike", 9),
    "kl_blowup": (dict(max_kl=1.0), lambda s, m: {"kl": 0.01 * s if s < 6 else 50.0}, "KL blow-up", 6),
    "reward_collapse": (
        dict(reward_collapse_drop=0.5, health_window=3),
        lambda s, m: {"reward": 1.0 if s < 6 else 0.0},
        "reward collapse",
        7,
    ),
    "spend": (dict(max_total_usd=0.5), lambda s, m: {"spend_usd": 0.1 * s}, "spend cap", 5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_health_and_spend_triggers(case, tiny_model, tmp_path):
    kwargs, inject, reason_part, stop_step = CASES[case]
    log = tmp_path / "kill_switch.jsonl"
    with KillSwitch(log_path=log, handle_signals=False, **kwargs) as switch:
        with pytest.raises(KillSwitchTriggered) as exc:
            train_loop(tiny_model, switch, tmp_path, inject=inject)
    assert reason_part in exc.value.reason and exc.value.exit_code == EXIT_KILL_SWITCH == 3
    assert (tmp_path / f"checkpoint-{stop_step}.pt").exists()
    (trigger,) = [r for r in _log(log) if r["event"] == "trigger"]
    assert trigger["reason"] == exc.value.reason and trigger["step"] == stop_step


def test_healthy_run_is_not_stopped(tiny_model, tmp_path):
    with KillSwitch(
        log_path=tmp_path / "ks.jsonl", max_total_usd=10, reward_collapse_drop=0.5, handle_signals=False
    ) as sw:
        assert train_loop(tiny_model, sw, tmp_path, inject=lambda s, m: {"reward": 0.5, "kl": 0.1}) == 10
    assert sw.should_stop() is None and not (tmp_path / "ks.jsonl").exists()


def test_spend_callable_stop_file_and_first_reason_wins(tmp_path):
    spent = [0.0]
    sw = KillSwitch(
        max_total_usd=1.0, spend=lambda: spent[0], stop_file=tmp_path / "STOP", handle_signals=False
    )
    assert sw() is None
    spent[0] = 1.0
    assert sw().startswith("spend cap")
    (tmp_path / "STOP").touch()
    assert sw().startswith("spend cap")  # latched: the first reason is the one reported
    sw2 = KillSwitch(stop_file=tmp_path / "STOP", handle_signals=False)
    assert "stop file" in sw2.should_stop()
    with pytest.raises(KillSwitchTriggered, match="stop file"):
        sw2.check()


def test_signals_set_a_flag_and_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with KillSwitch(log_path=tmp_path / "ks.jsonl") as sw:
        assert signal.getsignal(signal.SIGTERM) == sw._on_signal
        os.kill(os.getpid(), signal.SIGTERM)
        assert sw.should_stop() == "signal: SIGTERM"
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C is not swallowed
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_sandbox_violations_count_but_resource_limits_do_not(tmp_path):
    sw = KillSwitch(max_violations=2, log_path=tmp_path / "ks.jsonl", handle_signals=False)
    assert sw.record_violation("timeout", "sleep 100") is None
    assert sw.record_violation("memory_limit", "x") is None
    assert sw.record_violation("network", "curl http://example.com") is None
    assert "sandbox policy: mount" in sw.record_violation("mount", "mount -t tmpfs none /usr")
    events = [r["event"] for r in _log(tmp_path / "ks.jsonl")]
    assert events == ["violation"] * 4 + ["trigger"]


def test_invalid_config():
    with pytest.raises(ValueError, match="health_window"):
        KillSwitch(health_window=1, handle_signals=False)
    assert math.isnan(float("nan"))


# ----------------------------------------------------------------------------- HF Trainer callback
class _Inject:
    """A TrainerCallback that fires a fault at step ``at``."""

    def __new__(cls, at, fault):
        from transformers import TrainerCallback

        class Injector(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, **kw):
                if state.global_step == at:
                    fault(model)
                return control

        return Injector()


def _hf_train(model, tok, switch, out_dir, fault, at=2):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from composer_replication.safety.hf_callback import KillSwitchCallback

    ids = tok(["def add(a, b):\n    return a + b\n"] * 16)["input_ids"]
    ds = Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=2,
        max_steps=8,
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        report_to="none",
        learning_rate=1e-3,
        disable_tqdm=True,
    )
    cb = KillSwitchCallback(switch)
    # The fault callback goes first so the kill switch sees its effect in the same step.
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[_Inject(at, fault), cb]).train()
    return cb


HF_CASES = {
    "stop_file": lambda tmp: (dict(stop_file=tmp / "STOP"), lambda m: (tmp / "STOP").touch(), "stop file"),
    "sigterm": lambda tmp: (
        dict(handle_signals=True),
        lambda m: os.kill(os.getpid(), signal.SIGTERM),
        "SIGTERM",
    ),
    "nan_weights": lambda tmp: (
        dict(),
        lambda m: next(m.parameters()).data.fill_(float("inf")),
        "non-finite",
    ),
}


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_hf_callback_checkpoints_and_stops(case, tiny_model, tiny_tokenizer, tmp_path):
    kwargs, fault, reason_part = HF_CASES[case](tmp_path)
    kwargs.setdefault("handle_signals", False)
    with KillSwitch(log_path=tmp_path / "kill_switch.jsonl", **kwargs) as sw:
        cb = _hf_train(tiny_model, tiny_tokenizer, sw, tmp_path / "out", fault)
    assert cb.reason is not None and reason_part in cb.reason
    assert cb.checkpoint_step in (2, 3)  # the step the fault hit (a NaN shows in the next step's loss)
    assert (tmp_path / "out" / f"checkpoint-{cb.checkpoint_step}").is_dir()
    with pytest.raises(KillSwitchTriggered) as exc:
        cb.raise_if_triggered()
    assert exc.value.exit_code == 3
    assert [r["reason"] for r in _log(tmp_path / "kill_switch.jsonl") if r["event"] == "trigger"] == [
        cb.reason
    ]


def test_rollout_cli_exits_with_kill_switch_code(tmp_path):
    (tmp_path / "STOP").touch()
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_replication.cli.main",
            "rollout",
            "--out",
            str(out),
            "--stop-file",
            str(tmp_path / "STOP"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == EXIT_KILL_SWITCH, proc.stderr
    assert "stopped: stop file" in proc.stderr
    (trigger,) = [r for r in _log(out / "kill_switch.jsonl") if r["event"] == "trigger"]
    assert trigger["kind"] == "stop_file"
