"""The flags of a run of a model as a sandboxed agent, shared by ``rollout`` and ``eval``: its tools
(``--harness``), its limits (turns, generated tokens, wall time), the endpoint's model name and the
sandbox backend. Values are checked where they are used (``eval``'s ``_limits``)."""

from __future__ import annotations

import argparse


def add_agent_arguments(p: argparse.ArgumentParser, *, per: str, harness_help: str) -> None:
    """``--harness``, ``--max-turns``, ``--max-tokens``, ``--max-wall-s``, ``--endpoint-model`` and
    ``--sandbox`` on ``p``; ``per`` names one run in the help (``rollout``, ``attempt``)."""
    p.add_argument("--harness", choices=["claude_code", "codex"], help=harness_help)
    p.add_argument("--max-turns", type=int, default=8, metavar="N", help=f"agent turns per {per} (default 8)")
    p.add_argument(
        "--max-tokens", type=int, metavar="N", help=f"end a {per} after this many generated tokens"
    )
    p.add_argument("--max-wall-s", type=float, metavar="S", help=f"end a {per} after this many seconds")
    p.add_argument(
        "--endpoint-model",
        default="default",
        metavar="NAME",
        help="with an endpoint URL: the model name to ask for",
    )
    p.add_argument(
        "--sandbox", choices=["bwrap", "docker", "podman"],
        help="sandbox backend (default: docker when its daemon answers and the image is built, else bwrap)",
    )  # fmt: skip
