"""The GRPO phase on several processes and with vLLM generation: what the GRPO builder adds to TRL's config.

- :func:`grpo_config_kwargs` maps ``grpo.vllm`` to ``trl.GRPOConfig``'s ``use_vllm``, ``vllm_mode``,
  ``vllm_server_base_url``, ... and turns off DDP's per-forward buffer broadcast. The SDPO and DPO
  channels run extra forwards only on the processes whose batch holds hint or pair rows; with the
  broadcast on, that uneven number of collectives deadlocks ``accelerate launch`` runs. (The buffers are
  rotary tables, constant, so nothing is lost.)
- :func:`preflight` runs before any model loads: a ``server`` URL must answer ``GET /health/`` (what
  ``trl vllm-serve`` serves) within ``server_timeout_s``; ``colocate`` needs a GPU; vLLM must be
  importable (TRL's client and colocated engine import it), else the error names the extra.
"""

from __future__ import annotations

import importlib.util
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["grpo_config_kwargs", "preflight"]

EXTRA = "pip install 'composer-replication[vllm]'"


def grpo_config_kwargs(cfg: Any) -> dict[str, Any]:
    """``trl.GRPOConfig`` fields for a multi-process, optionally vLLM-generating GRPO run."""
    out: dict[str, Any] = {"ddp_broadcast_buffers": False}
    v = cfg.grpo.vllm
    if v is None:
        return out
    out.update(use_vllm=True, vllm_mode=v.mode, vllm_max_model_length=v.max_model_length)
    if v.mode == "server":
        out.update(vllm_server_base_url=v.server_url.rstrip("/"), vllm_server_timeout=v.server_timeout_s)
    else:
        out.update(
            vllm_gpu_memory_utilization=v.gpu_memory_utilization,
            vllm_tensor_parallel_size=v.tensor_parallel_size,
            vllm_enable_sleep_mode=v.enable_sleep_mode,
        )
    return out


def _answers(url: str, timeout_s: float) -> str | None:
    """None once ``url`` answers 200, else the last failure (polled until ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, timeout_s)) as resp:
                if resp.status == 200:
                    return None
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            return last
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def preflight(cfg: Any) -> None:
    """Check ``grpo.vllm`` against the machine (module docstring); ``ValueError`` / ``ImportError``."""
    v = cfg.grpo.vllm
    if v is None:
        return
    if v.mode == "server":
        url = v.server_url.rstrip("/") + "/health/"
        failure = _answers(url, v.server_timeout_s)
        if failure is not None:
            raise ValueError(
                f"grpo.vllm.server_url: {url} did not answer within {v.server_timeout_s:g} s ({failure}); "
                "start the server first: trl vllm-serve --model MODEL --port PORT"
            )
    else:
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                "grpo.vllm.mode colocate runs vLLM on each process's GPU, and there is none here"
            )
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"grpo.vllm needs vLLM in the training environment: {EXTRA}")
