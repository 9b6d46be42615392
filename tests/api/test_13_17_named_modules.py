"""API reference §13–§17, the modules the table of contents names: prime-rl's loss, Monarch's actors, the
cloud executors, the docker sandbox, the kill switch."""

from __future__ import annotations

import importlib
import inspect

import pytest

# §13–§17 (named in the table of contents)
MODULES = [
    "composer_replication.recipes.prime_rl.composer_loss",
    "composer_replication.recipes.monarch.actors",
    "composer_replication.diloco.serverless.eks",
    "composer_replication.diloco.serverless.sagemaker",
    "composer_replication.datagen.docker_sandbox",
    "composer_replication.safety",
    "composer_replication.safety.kill_switch",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


P = inspect.Parameter


def test_kill_switch_contract():
    """§17 is only named; the shared contract in the team brief fixes these names."""
    from composer_replication.safety import kill_switch as ks

    assert ks.EXIT_KILL_SWITCH == 3
    assert issubclass(ks.KillSwitchTriggered, RuntimeError)
    err = ks.KillSwitchTriggered("spend cap")
    assert err.reason == "spend cap" and err.exit_code == 3
    for method, params in (
        ("observe", ["self", "metrics"]),
        ("record_violation", ["self", "kind", "detail"]),
        ("should_stop", ["self"]),
    ):
        sig = inspect.signature(getattr(ks.KillSwitch, method))
        assert list(sig.parameters)[: len(params)] == params, f"KillSwitch.{method}{sig}"
    assert inspect.signature(ks.KillSwitch.observe).parameters["metrics"].kind is P.VAR_KEYWORD
