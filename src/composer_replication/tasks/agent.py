"""A model as an ``eval`` policy: each attempt is a rollout in the task's harness, scored by the verifier.

`model_policy(spec)` turns what ``eval --model`` names into an `AgentPolicy`:

- ``default`` (SmolLM2-135M-Instruct, offline), ``tiny`` (the random test model) or a local model
  directory: in process (``datagen.rollout.HFPolicy``, the one generation engine);
- a LoRA adapter directory (``adapter_config.json``): its base model with the adapter merged in
  (``models.load_adapter``);
- an ``http(s)://.../v1`` URL: an OpenAI-compatible endpoint (``datagen.rollout.EndpointPolicy``;
  ``endpoint_model`` is the model name sent; the key, if the server needs one, from ``OPENAI_API_KEY``).

`AgentPolicy.attempt` runs ``datagen.rollout.run_rollout``: the harness's tools over a sandbox holding the
task's files, until the model answers without a tool call or a limit (``max_turns``, ``max_tokens``
generated, ``max_wall_s``) ends it; the rollout is written as a session log in the harness's own format
(Claude Code or Codex) under ``log_dir``, so ``ingest`` reads it back. A sandbox or endpoint failure is an
infrastructure failure (counted apart by `tasks.evaluate`), never a score.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composer_replication.datagen.sandbox import make_sandbox
from composer_replication.datagen.tasks import Task

__all__ = ["AgentPolicy", "model_policy"]


@dataclass
class AgentPolicy:
    """``chat`` (chat messages -> assistant text: ``HFPolicy``, ``EndpointPolicy``, ``ScriptedPolicy``)
    as an agent with per-attempt limits (module docstring)."""

    name: str
    chat: Any
    max_turns: int = 8
    max_tokens: int | None = None
    max_wall_s: float | None = None
    tool_timeout: float = 30.0

    def attempt(
        self, task: Task, *, sandbox: Any, harness: str | None, rollout_id: str, log_dir: Path, stop: Any
    ) -> dict[str, Any]:
        """One rollout of ``task`` (the row `tasks.evaluate.run_task` writes, plus ``end_reason`` and
        ``session_log``)."""
        from composer_replication.datagen.rollout import run_rollout
        from composer_replication.teacher_replay.backends.base import TeacherError

        factory = sandbox if callable(sandbox) else (lambda: make_sandbox(sandbox))
        log_dir.mkdir(parents=True, exist_ok=True)
        self._offer_tools(harness)
        try:
            r = run_rollout(
                task, self.chat, rollout_id=rollout_id, log_dir=log_dir, sandbox_factory=factory,
                max_turns=self.max_turns, tool_timeout=self.tool_timeout, stop=stop, harness=harness,
                max_tokens=self.max_tokens, max_wall_s=self.max_wall_s,
            )  # fmt: skip
        except TeacherError as e:  # the endpoint failed: not the model's doing
            return {"infra_error": f"endpoint: {e}", "seconds": 0.0, "session_log": None}
        row: dict[str, Any] = {
            "seconds": round(r.duration_s, 2),
            "turns": r.turns,
            "tokens": r.tokens,
            "end_reason": r.end_reason,
            "session_log": Path(r.session_log).name if r.session_log else None,
        }
        if r.status == "infra_error":
            return {**row, "infra_error": r.error}
        return {
            **row,
            "solved": r.reward == 1.0,
            "checks_passed": sum(r.checks),
            "checks": len(r.checks),
            "protected_touched": r.protected_touched,
        }

    def _offer_tools(self, harness: str | None) -> None:
        """The harness's tool schemas to the model: an in-process policy that renders them (``tools``), an
        endpoint's requests (the OpenAI ``tools`` field)."""
        from composer_replication.datagen.harness import harness_schemas

        tools = harness_schemas(harness)
        if hasattr(self.chat, "tools"):
            self.chat.tools = tools
        extra = getattr(getattr(self.chat, "engine", None), "extra_body", None)
        if isinstance(extra, dict):
            extra["tools"] = tools


def model_policy(
    spec: str,
    *,
    name: str | None = None,
    endpoint_model: str = "default",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    max_turns: int = 8,
    max_tokens: int | None = None,
    max_wall_s: float | None = None,
) -> AgentPolicy:
    """The `AgentPolicy` for ``spec`` (module docstring); ``name`` defaults to ``spec``. Raises
    ``FileNotFoundError`` / ``ValueError`` with one line naming the model when it cannot be loaded."""
    from composer_replication.datagen import rollout

    chat: Any
    if spec.startswith(("http://", "https://")):
        from composer_replication.config.base import check_base_url
        from composer_replication.teacher_replay.endpoint import OpenAIEndpoint
        from composer_replication.teacher_replay.keys import resolve_api_key

        check_base_url(spec, "--model")
        endpoint = OpenAIEndpoint(spec, endpoint_model, api_key=resolve_api_key(None, "OPENAI_API_KEY"))
        chat = rollout.EndpointPolicy(endpoint, max_new_tokens=max_new_tokens, temperature=temperature)
    else:
        from composer_replication.models import load_model_and_tokenizer

        if spec not in ("default", "tiny"):
            d = Path(spec).expanduser()
            if not d.is_dir():
                raise FileNotFoundError(
                    f"--model {spec}: not `default`, `tiny`, a model or adapter directory, or an http(s)://.../v1 URL"
                )
            if not any((d / f).is_file() for f in ("config.json", "adapter_config.json")):
                raise FileNotFoundError(
                    f"--model {spec}: no config.json or adapter_config.json there (not a saved model or adapter)"
                )
        model, tok = load_model_and_tokenizer(spec)
        chat = rollout.HFPolicy(model.eval(), tok, max_new_tokens=max_new_tokens, temperature=temperature)
    return AgentPolicy(name or spec, chat, max_turns=max_turns, max_tokens=max_tokens, max_wall_s=max_wall_s)
