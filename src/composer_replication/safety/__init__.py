"""Safety: the kill switch that stops spending, unhealthy training and sandbox abuse, with a stated reason.

``KillSwitchCallback`` (the HF/TRL callback) lives in ``safety.hf_callback`` and is imported lazily so this
package never imports transformers.
"""

from __future__ import annotations

from composer_replication.safety.kill_switch import (
    BENIGN_VIOLATIONS,
    EXIT_KILL_SWITCH,
    KillSwitch,
    KillSwitchTriggered,
)
from composer_replication.safety.stop import Stop, any_stop, as_stop

__all__ = [
    "BENIGN_VIOLATIONS",
    "EXIT_KILL_SWITCH",
    "KillSwitch",
    "KillSwitchCallback",
    "KillSwitchTriggered",
    "Stop",
    "any_stop",
    "as_stop",
]


def __getattr__(name: str):
    if name == "KillSwitchCallback":
        from composer_replication.safety.hf_callback import KillSwitchCallback

        return KillSwitchCallback
    raise AttributeError(f"module 'composer_replication.safety' has no attribute {name!r}")
