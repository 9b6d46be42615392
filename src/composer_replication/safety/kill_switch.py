"""The safety kill switch: one object that every long-running loop polls, and that says *why* it stopped.

What is covered (each is a trigger; the first one latches, is appended to ``kill_switch.jsonl`` and is
returned by `KillSwitch.should_stop` from then on):

- **spend**: the dollar ledger reaches ``max_total_usd`` (a value passed to ``observe(spend_usd=...)``
  or a ``spend`` callable read on every poll, e.g. the replay ledger's total);
- **training health**: a non-finite loss / grad norm / KL; a grad-norm spike above ``grad_spike_factor``
  times the running median of the last ``health_window`` norms; KL above ``max_kl``; reward collapse
  (the mean reward of the last ``health_window`` observations fell more than ``reward_collapse_drop``
  below the best earlier window mean);
- **sandbox policy**: ``record_violation(kind, detail)`` from the sandbox or the rollout loop; resource
  limits that merely fired (timeouts, memory, cpu...) are logged but do not count; ``max_violations``
  escape attempts stop the run;
- **operator**: a STOP file appears (``stop_file``), or SIGTERM / SIGINT arrives (handlers set a flag and
  are restored on `close`; a second SIGINT falls through to the previous handler).

A `KillSwitch` is a `safety.stop.Stop`: loops take it as ``stop=`` and call ``stop()`` between steps and
``stop.observe(...)`` with what they see (metrics; ``violation=(kind, detail)`` for a sandbox policy hit).

What is not covered: the switch is cooperative — loops must poll it (``stop=switch`` or
``switch.check()``) between steps; it cannot interrupt a step in flight or a hung C call.
On a trigger, the owner checkpoints, then raises `KillSwitchTriggered`; CLIs exit with
``EXIT_KILL_SWITCH`` (3).
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from composer_replication._io import JsonlAppender

EXIT_KILL_SWITCH = 3

# Resource limits that fired inside the sandbox: the isolation worked, the agent was merely wasteful.
BENIGN_VIOLATIONS = frozenset(
    {"timeout", "memory_limit", "cpu_limit", "nproc_limit", "fsize_limit", "workspace_limit"}
)


class KillSwitchTriggered(RuntimeError):
    """Raised by a loop that saw the kill switch fire; ``.reason`` says why, ``.exit_code`` is 3."""

    def __init__(self, reason: str, *, exit_code: int = EXIT_KILL_SWITCH) -> None:
        super().__init__(f"kill switch: {reason}")
        self.reason = reason
        self.exit_code = exit_code


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(float(x))


class KillSwitch:
    """Watches spend, training health, sandbox policy, a STOP file and signals (module docstring).

    Args:
        max_total_usd: stop once spend reaches this many dollars (None: no cap here).
        spend: a callable returning the dollars spent so far, read on every `should_stop`.
        stop_file: stop when this path exists.
        log_path: where trigger and violation records are appended (JSONL); None keeps them in memory.
        grad_spike_factor: stop when ``grad_norm > factor * median(last health_window norms)``.
        health_window: window length for the grad-norm median and the reward-collapse means.
        max_kl: stop when ``kl`` exceeds this.
        reward_collapse_drop: stop when the window mean reward drops this much below the best window.
        max_violations: stop after this many non-benign sandbox violations.
        handle_signals: install SIGTERM/SIGINT handlers (main thread only) until `close`.
    """

    def __init__(
        self,
        *,
        max_total_usd: float | None = None,
        spend: Callable[[], float] | None = None,
        stop_file: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        grad_spike_factor: float | None = 10.0,
        health_window: int = 20,
        max_kl: float | None = 10.0,
        reward_collapse_drop: float | None = None,
        max_violations: int = 1,
        handle_signals: bool = True,
    ) -> None:
        if health_window < 2:
            raise ValueError(f"health_window must be >= 2, got {health_window}")
        self.max_total_usd = max_total_usd
        self.spend = spend
        self.stop_file = Path(stop_file) if stop_file is not None else None
        self.log_path = Path(log_path) if log_path is not None else None
        self.grad_spike_factor = grad_spike_factor
        self.health_window = health_window
        self.max_kl = max_kl
        self.reward_collapse_drop = reward_collapse_drop
        self.max_violations = max_violations
        self.reason: str | None = None
        self.step: int | None = None
        self.violations: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self._grad_norms: deque[float] = deque(maxlen=health_window)
        self._rewards: deque[float] = deque(maxlen=health_window)
        self._best_reward_window: float | None = None
        self._signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._lock = threading.Lock()
        if handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    # ----------------------------------------------------------------- inputs
    def observe(self, **metrics: Any) -> str | None:
        """Feed metrics (``step``, ``loss``, ``grad_norm``, ``kl``, ``reward``, ``spend_usd``, ...) or a
        sandbox ``violation=(kind, detail)`` (see `record_violation`).

        Unknown keys are ignored; missing keys are not checked. Returns the reason if this (or an earlier)
        observation triggered the switch, else what `should_stop` says (a STOP file, a signal, the spend).
        """
        if "step" in metrics and metrics["step"] is not None:
            self.step = int(metrics["step"])
        if (violation := metrics.get("violation")) is not None:
            kind, detail = violation
            if reason := self.record_violation(kind, detail):
                return reason
        for key in ("loss", "grad_norm", "kl"):
            value = metrics.get(key)
            if value is not None and not _finite(float(value)):
                return self.trigger(f"training health: non-finite {key} ({value})", kind="health")
        if (gn := metrics.get("grad_norm")) is not None:
            gn = float(gn)
            if self.grad_spike_factor is not None and len(self._grad_norms) >= max(
                3, self.health_window // 4
            ):
                median = statistics.median(self._grad_norms)
                if median > 0 and gn > self.grad_spike_factor * median:
                    return self.trigger(
                        f"training health: grad-norm spike {gn:.4g} > {self.grad_spike_factor:g} x running median "
                        f"{median:.4g}",
                        kind="health",
                    )
            self._grad_norms.append(gn)
        if (kl := metrics.get("kl")) is not None and self.max_kl is not None and float(kl) > self.max_kl:
            return self.trigger(
                f"training health: KL blow-up {float(kl):.4g} > {self.max_kl:g}", kind="health"
            )
        if (reward := metrics.get("reward")) is not None and _finite(float(reward)):
            if reason := self._observe_reward(float(reward)):
                return reason
        if (spent := metrics.get("spend_usd")) is not None:
            if reason := self._check_spend(float(spent)):
                return reason
        return self.should_stop()  # as any `Stop`: observing also polls (STOP file, signal, spend)

    def _observe_reward(self, reward: float) -> str | None:
        self._rewards.append(reward)
        if self.reward_collapse_drop is None or len(self._rewards) < self.health_window:
            return None
        mean = sum(self._rewards) / len(self._rewards)
        best = self._best_reward_window
        if best is not None and best - mean > self.reward_collapse_drop:
            return self.trigger(
                f"training health: reward collapse, window mean {mean:.4g} vs best {best:.4g} "
                f"(drop > {self.reward_collapse_drop:g})",
                kind="health",
            )
        self._best_reward_window = mean if best is None else max(best, mean)
        return None

    def _check_spend(self, spent: float) -> str | None:
        if self.max_total_usd is not None and spent >= self.max_total_usd:
            return self.trigger(f"spend cap: ${spent:.4f} >= ${self.max_total_usd:.4f}", kind="spend")
        return None

    def record_violation(self, kind: str, detail: str) -> str | None:
        """Report a sandbox policy hit (e.g. ``("network", "curl http://...")``). Returns the reason if it stops."""
        record = {
            "event": "violation",
            "kind": kind,
            "detail": detail[:500],
            "time": time.time(),
            "step": self.step,
        }
        with self._lock:
            self.violations.append(record)
        self._append(record)
        if kind in BENIGN_VIOLATIONS:
            return self.reason
        serious = [v for v in self.violations if v["kind"] not in BENIGN_VIOLATIONS]
        if len(serious) >= self.max_violations:
            return self.trigger(f"sandbox policy: {kind}: {detail[:200]}", kind="sandbox")
        return self.reason

    # ----------------------------------------------------------------- decisions
    def trigger(self, reason: str, *, kind: str = "manual") -> str:
        """Latch ``reason`` (the first trigger wins) and append it to the log. Returns the latched reason."""
        with self._lock:
            if self.reason is not None:
                return self.reason
            self.reason = reason
        self._append(
            {"event": "trigger", "kind": kind, "reason": reason, "time": time.time(), "step": self.step}
        )
        return reason

    def should_stop(self) -> str | None:
        """The reason to stop, or None. Cheap enough to call every step (a stat and maybe a ledger read)."""
        if self.reason is not None:
            return self.reason
        if self._signal is not None:
            return self.trigger(f"signal: {signal.Signals(self._signal).name}", kind="signal")
        if self.stop_file is not None and self.stop_file.exists():
            return self.trigger(f"stop file: {self.stop_file}", kind="stop_file")
        if self.spend is not None:
            return self._check_spend(float(self.spend()))
        return None

    __call__ = should_stop  # a KillSwitch *is* a `stop: Callable[[], str | None]`

    def check(self) -> None:
        """Raise `KillSwitchTriggered` if the switch has fired (for loops with nothing to checkpoint)."""
        if (reason := self.should_stop()) is not None:
            raise KillSwitchTriggered(reason)

    # ----------------------------------------------------------------- plumbing
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signal is not None and signum == signal.SIGINT:
            previous = self._previous_handlers.get(signum)
            if callable(previous):
                previous(signum, frame)
                return
            raise KeyboardInterrupt
        self._signal = signum

    def _append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with JsonlAppender(self.log_path) as log:
                log.write(record)

    def close(self) -> None:
        """Restore the signal handlers this switch installed."""
        for sig, previous in self._previous_handlers.items():
            signal.signal(sig, previous)
        self._previous_handlers.clear()

    def __enter__(self) -> KillSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a forgotten switch must not keep hijacking Ctrl-C
        try:
            if self._previous_handlers and threading.current_thread() is threading.main_thread():
                self.close()
        except Exception:
            pass
