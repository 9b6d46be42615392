"""One stop type (``safety.stop``): a `KillSwitch` is a `Stop`, a plain callable becomes one, and the
older ``kill_switch=`` name is the same argument."""

from __future__ import annotations

import pytest

from composer_replication.safety import KillSwitch, Stop, as_stop
from composer_replication.safety.stop import NEVER


def test_a_kill_switch_is_a_stop_and_passes_through(tmp_path):
    with KillSwitch(handle_signals=False, stop_file=tmp_path / "STOP") as switch:
        assert isinstance(switch, Stop)
        assert as_stop(switch) is switch
        assert as_stop(kill_switch=switch) is switch
        assert as_stop(switch, kill_switch=switch) is switch
        (tmp_path / "STOP").touch()
        assert "stop file" in switch()


def test_a_plain_callable_is_polled_and_observe_polls_it_too():
    reasons = iter([None, "operator said so"])
    stop = as_stop(lambda: next(reasons))
    assert isinstance(stop, Stop)
    assert stop() is None
    assert stop.observe(loss=1.0) == "operator said so"


def test_no_stop_never_stops():
    assert as_stop() is NEVER
    assert NEVER() is None and NEVER.observe(loss=float("nan")) is None


def test_two_different_stops_are_refused():
    with KillSwitch(handle_signals=False) as switch:
        with pytest.raises(TypeError, match="name the same argument"):
            as_stop(lambda: None, kill_switch=switch)
    with pytest.raises(TypeError, match="must be a KillSwitch or a callable"):
        as_stop("STOP")  # type: ignore[arg-type]


def test_observe_carries_sandbox_violations(tmp_path):
    with KillSwitch(handle_signals=False, max_violations=2, log_path=tmp_path / "ks.jsonl") as switch:
        assert switch.observe(violation=("timeout", "sleep 999")) is None  # benign: logged only
        assert switch.observe(violation=("network", "curl http://x")) is None
        reason = switch.observe(violation=("network", "wget http://y"))
    assert reason is not None and reason.startswith("sandbox policy: network")
    assert [v["kind"] for v in switch.violations] == ["timeout", "network", "network"]


def test_the_hf_callback_takes_any_stop():
    from transformers import TrainerControl, TrainerState

    from composer_replication.safety.hf_callback import KillSwitchCallback

    cb = KillSwitchCallback(lambda: "budget gone")
    control = cb.on_step_end(None, TrainerState(global_step=4), TrainerControl())
    assert control.should_save and control.should_training_stop
    assert (cb.reason, cb.checkpoint_step) == ("budget gone", 4)


def test_any_stop_combines_stop_and_kill_switch(tmp_path):
    from composer_replication.safety import any_stop

    assert any_stop() is NEVER and any_stop(None, None) is NEVER
    with KillSwitch(handle_signals=False, stop_file=tmp_path / "STOP", max_spend_usd=1.0) as switch:
        assert any_stop(None, switch) is switch  # one given: that one, as as_stop makes it
        polls = []

        def plain() -> str | None:
            polls.append(1)
            return None

        both = any_stop(plain, switch)
        assert isinstance(both, Stop) and both() is None and len(polls) == 1
        assert both.observe(spend_usd=2.0).startswith("spend cap")  # fed to every stop, the switch fires
        assert len(polls) == 2 and both() == switch.reason


def test_observing_a_kill_switch_also_polls_it(tmp_path):
    with KillSwitch(handle_signals=False, stop_file=tmp_path / "STOP") as switch:
        assert switch.observe(loss=1.0) is None
        (tmp_path / "STOP").touch()
        assert "stop file" in switch.observe(loss=1.0)
