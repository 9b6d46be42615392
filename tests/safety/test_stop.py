"""One stop type (``safety.stop``): a `KillSwitch` is a `Stop`, a plain callable becomes one, and every
loop takes it as ``stop=`` (no ``kill_switch=`` parameter anywhere in src: a scan below checks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from composer_replication.safety import KillSwitch, Stop, as_stop
from composer_replication.safety.stop import NEVER


def test_a_kill_switch_is_a_stop_and_passes_through(tmp_path):
    with KillSwitch(handle_signals=False, stop_file=tmp_path / "STOP") as switch:
        assert isinstance(switch, Stop)
        assert as_stop(switch) is switch
        with pytest.raises(TypeError, match="kill_switch"):  # one name: the older one is gone
            as_stop(kill_switch=switch)  # type: ignore[call-arg]
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
        with pytest.raises(TypeError, match="kill_switch"):
            as_stop(lambda: None, kill_switch=switch)  # type: ignore[call-arg]
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
    with KillSwitch(handle_signals=False, stop_file=tmp_path / "STOP", max_total_usd=1.0) as switch:
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


# --- one name: ``stop`` --------------------------------------------------------------------------------
SRC = Path(__file__).resolve().parents[1] / "src" / "composer_replication"
# Where the API reference (the spec) names a ``kill_switch`` parameter, keyword or attribute (file -> names). It
# names only the module ``safety.kill_switch`` (and its `KillSwitch` type), so nothing is allowed here.
SPEC_KILL_SWITCH: dict[str, set[str]] = {}


def kill_switch_names(source: str) -> list[str]:
    """``kill_switch`` as a parameter, a call's keyword, a name or an attribute: ``"<what> line <n>"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
            found += [f"parameter line {node.lineno}" for p in params if p.arg.strip("_") == "kill_switch"]
        elif isinstance(node, ast.keyword) and node.arg == "kill_switch":
            found.append(f"keyword line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id.strip("_") == "kill_switch":
            found.append(f"name line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr.strip("_") == "kill_switch":
            found.append(f"attribute line {node.lineno}")
    return found


def test_the_scan_sees_parameters_keywords_and_attributes():
    src = (
        "def f(x, *, kill_switch=None):\n    return g(kill_switch=kill_switch)\n"
        "class C:\n    def __init__(self, stop):\n        self._kill_switch = stop\n"
    )
    assert sorted(kill_switch_names(src)) == [
        "attribute line 5",
        "keyword line 2",
        "name line 2",
        "parameter line 1",
    ]
    assert kill_switch_names("from composer_replication.safety.kill_switch import KillSwitch\n") == []


def test_the_stop_is_called_stop_everywhere_in_src():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        allowed = SPEC_KILL_SWITCH.get(rel, set())
        bad += [f"{rel}: {hit}" for hit in kill_switch_names(path.read_text(encoding="utf-8"))
                if hit.split()[0] not in allowed]  # fmt: skip
    assert not bad, "take the stop as `stop=` (a safety.Stop), not `kill_switch`:\n" + "\n".join(bad)


def test_one_spend_cap_name_and_one_default():
    """The cap is ``max_total_usd`` everywhere (``--max-usd`` on the command line); its 5.0 default lives
    in ``config.run.MAX_TOTAL_USD`` alone (a literal default other than 0, "no paid calls", is a copy)."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Name, ast.Attribute, ast.arg, ast.keyword)):
                name = getattr(node, "id", None) or getattr(node, "attr", None) or getattr(node, "arg", None)
                if name == "max_spend_usd":
                    bad.append(f"{rel} line {node.lineno}: max_spend_usd (call it max_total_usd)")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = list(zip(a.args[len(a.args) - len(a.defaults) :], a.defaults, strict=True))
                for arg, default in [*pos, *zip(a.kwonlyargs, a.kw_defaults, strict=True)]:
                    literal = isinstance(default, ast.Constant) and default.value not in (0, 0.0, None)
                    if arg.arg == "max_total_usd" and literal:
                        bad.append(
                            f"{rel} line {node.lineno}: max_total_usd={default.value} (use MAX_TOTAL_USD)"
                        )
    assert not bad, "\n".join(bad)
