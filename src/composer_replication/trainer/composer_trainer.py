"""``ComposerReplicationTrainer``: TRL's ``GRPOTrainer`` + α·SDPO + β·trace-replay DPO.

The loss hook is ``_compute_loss`` (the narrowest one TRL offers). TRL's ``_generate_and_score_completions``
builds its output dict from scratch, so we wrap it (``super()``, then append per-row tensors: they survive
``shuffle_sequence_dict`` / ``split_tensor_dict``; 0-d tensors go to every split, as TRL's own
``num_items_in_batch`` does). Extra dataset columns read here:

- ``hint`` (str), or ``error_kind`` (+ optional ``error_meta`` dict or JSON text) resolved by
  ``hint_generator.dispatch``: the SDPO teacher is the same model given the prompt plus the hint
  (``wire.add_hint``). ``trainer.grpo.columns`` decodes the columns and picks each row's hint.
- Online SDPO: a reward function may publish ``last_hints`` (one hint or None per completion of its
  last call, as ``datagen.reward.make_shaped_reward`` does at the first failed tool call of each
  sandboxed completion); a completion with a hint gets the hinted teacher. With TRL tools, a rollout
  whose tool call failed gets a hint built on the fly.
- ``dpo_pair``: a ``DPOPair`` / ``NormalizedDPOPair`` dict (or its JSON text). Its reference log-probs
  are computed once, with the reference model (TRL's ``ref_model``, the base model with PEFT adapters
  disabled, or the initial weights), and cached by pair id.

Scaling: each channel is a mean over its own tokens (SDPO) or pairs (DPO), normalised like TRL's own
term: for ``dapo``/``cispo``/``vespo`` by the generation-batch count rescaled to one accumulation
window (as TRL does with ``num_items_in_batch``), otherwise per micro-batch and divided by the
gradient-accumulation steps. ``sdpo_wrapper="taid"`` takes a ``distillation.TAIDScheduler``: ``t``
advances after each optimizer step with the step's SDPO loss and is saved in every checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import TYPE_CHECKING, Any, Literal, cast

import torch

from composer_replication import encoding, wire
from composer_replication._extras import is_available, require
from composer_replication.config.loss import (
    DPO_BETA,
    JSD_BETA,
    PREFERENCE_WEIGHT,
    RPO_ALPHA,
    SDPO_WEIGHT,
    SIMPO_BETA,
    SIMPO_GAMMA,
    LossConfig,
)
from composer_replication.loss import ComposedLoss
from composer_replication.trainer import pair_tokens
from composer_replication.trainer.grpo import columns

if is_available("trl"):
    from transformers import TrainerCallback
    from trl import GRPOTrainer
else:  # the module imports without TRL; building the trainer names the extra to install

    class GRPOTrainer:  # type: ignore[no-redef]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            require("trl", "trl", purpose="ComposerReplicationTrainer")

    TrainerCallback = object  # type: ignore[misc,assignment]


if TYPE_CHECKING:
    from trl import GRPOConfig

logger = logging.getLogger(__name__)

_GLOBAL_NORM = ("dapo", "cispo", "vespo")
HINT_PREFIX = wire.HINT_PREFIX  # offline (collator) and online teachers see the same form


class ComposerReplicationTrainer(GRPOTrainer):
    """GRPO-family policy loss (any TRL ``loss_type``) + α·SDPO + β·DPO; see the module docstring."""

    # What TRL's __init__ sets, as this class uses it (the base types leave them optional / generic).
    model: torch.nn.Module
    args: GRPOConfig
    _channel_metrics: dict[str, float]

    def __init__(
        self,
        *args: Any,
        alpha_sdpo: float = SDPO_WEIGHT,
        beta_replay: float = PREFERENCE_WEIGHT,
        sdpo_jsd_beta: float = JSD_BETA,
        sdpo_temperature: float = 1.0,
        sdpo_token_clip: float | None = None,
        replay_dpo_beta: float = DPO_BETA,
        dpo_variant: str = "dpo",
        simpo_beta: float = SIMPO_BETA,
        simpo_gamma: float = SIMPO_GAMMA,
        composer_kl_coef: float = 0.0,
        max_dpo_seq_len: int = 2048,
        sdpo_wrapper: str = "none",
        entropy_opd_h_max: float | None = None,
        sdpo_taid: Any = None,
        replay_rpo_alpha: float = RPO_ALPHA,
        sdpo_top_k: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if alpha_sdpo < 0 or beta_replay < 0 or composer_kl_coef < 0:
            raise ValueError("alpha_sdpo, beta_replay and composer_kl_coef must be >= 0")
        if sdpo_wrapper not in ("none", "entropy_opd", "taid") or (sdpo_wrapper == "taid") != (
            sdpo_taid is not None
        ):
            raise ValueError(
                f"sdpo_wrapper={sdpo_wrapper!r}: 'none' (GJSD), 'entropy_opd', or 'taid' with sdpo_taid "
                "(a distillation.TAIDScheduler) and only then"
            )
        if dpo_variant not in ("dpo", "simpo"):
            raise ValueError(f"dpo_variant {dpo_variant!r}: use 'dpo' or 'simpo'")
        if replay_rpo_alpha < 0:
            raise ValueError(f"replay_rpo_alpha={replay_rpo_alpha}: use 0 (off) or a positive RPO weight")
        # the flat arguments are the loss section's fields: the channels and their sum come from one object
        self.loss = ComposedLoss(
            LossConfig.from_compose_loss_kwargs(
                alpha_sdpo=alpha_sdpo, beta_replay=beta_replay, lm_ce_label_smoothing=0.0,
                sdpo_wrapper=sdpo_wrapper, sdpo_jsd_beta=sdpo_jsd_beta, sdpo_temperature=sdpo_temperature,
                sdpo_token_clip=sdpo_token_clip, entropy_opd_h_max=entropy_opd_h_max, sdpo_top_k=sdpo_top_k,
                dpo_variant=dpo_variant, replay_dpo_beta=replay_dpo_beta, simpo_beta=simpo_beta,
                simpo_gamma=simpo_gamma, replay_rpo_alpha=replay_rpo_alpha,
            )
        )  # fmt: skip
        self.alpha_sdpo, self.beta_replay = alpha_sdpo, beta_replay
        self.dpo_variant = cast(Literal["dpo", "simpo"], dpo_variant)
        self.sdpo_taid, self._taid_losses = sdpo_taid, cast(list[float], [])
        if sdpo_taid is not None:
            self.add_callback(_TAIDStep(self))
        self.composer_kl_coef = composer_kl_coef
        self.max_dpo_seq_len = max_dpo_seq_len
        self._ref_logps_cache: dict[str, tuple[float, float]] = {}
        self._frozen_ref: torch.nn.Module | None = None
        needs_own_ref = (beta_replay > 0 and dpo_variant == "dpo") or composer_kl_coef > 0
        if needs_own_ref and self.ref_model is None and not self._is_peft():
            # The initial weights, frozen: DPO and k1 need a reference even when TRL's beta is 0.
            self._frozen_ref = copy.deepcopy(self.accelerator.unwrap_model(self.model)).eval()
            self._frozen_ref.requires_grad_(False)

    # ---------------------------------------------------------------- reference model
    def _is_peft(self) -> bool:
        return hasattr(self.accelerator.unwrap_model(self.model), "peft_config")

    def _ref_forward_context(self):
        import contextlib

        if self.ref_model is not None:
            return self.ref_model, contextlib.nullcontext()
        if self._frozen_ref is not None:
            return self._frozen_ref, contextlib.nullcontext()
        model = self.accelerator.unwrap_model(self.model)
        return model, model.disable_adapter()

    @torch.no_grad()
    def _reference_pair_logps(self, enc: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Reference summed log-probs per pair, computed once per pair id and cached."""
        first = {pid: i for i, pid in reversed(list(enumerate(enc["pair_ids"])))}  # one pass per new id
        missing = sorted(i for pid, i in first.items() if pid not in self._ref_logps_cache)
        if missing:
            ref, ctx = self._ref_forward_context()
            dev = self.accelerator.device
            with ctx:
                idx = torch.tensor(missing)
                out = [
                    self._sequence_logprobs(
                        ref,
                        enc[f"dpo_{s}_input_ids"][idx].to(dev),
                        enc[f"dpo_{s}_response_mask"][idx].to(dev),
                    )
                    for s in ("chosen", "rejected")
                ]
            for j, i in enumerate(missing):
                self._ref_logps_cache[enc["pair_ids"][i]] = (float(out[0][j]), float(out[1][j]))
        vals = torch.tensor([self._ref_logps_cache[pid] for pid in enc["pair_ids"]], dtype=torch.float32)
        return vals[:, 0], vals[:, 1]

    # ---------------------------------------------------------------- carrying extra columns
    def _prompt_with_hint(self, prompt: Any, hint: str) -> Any:
        """The prompt with the hint appended to its last user message (``wire.add_hint``, as offline)."""
        if isinstance(prompt, str):
            return wire.with_hint(prompt, hint)
        return wire.add_hint(prompt, hint)

    def _row_hints(self, inputs: list[dict]) -> list[str | None]:
        """Each row's hint for the SDPO teacher (``grpo.columns.row_hints``)."""
        recent = list(self._logs["completion"])[-len(inputs) :] if self.tools else [None] * len(inputs)
        return columns.row_hints(inputs, recent, self.reward_funcs)

    def _tokenize_prompt(self, prompt: Any, tools: Any = None) -> list[int]:
        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        return encoding.render_prompt_ids(tok, prompt, tools)

    def _tokenize_prompts(self, prompts: list) -> Any:
        """Chat prompts rendered by ``wire`` with their row's tool schemas (the ``tools`` column), in the
        active wire format: the tokens the collator and evaluation give the same state. With TRL's own
        tools (``environment_factory``) TRL renders."""
        if self.tools or not prompts or not isinstance(prompts[0], list):
            return super()._tokenize_prompts(prompts)
        tools = getattr(self, "_prompt_tools", None) or [None] * len(prompts)
        if len(tools) != len(prompts):
            raise RuntimeError(f"{len(prompts)} prompts but {len(tools)} rows of tools")
        return [self._tokenize_prompt(p, t) for p, t in zip(prompts, tools)], None, {}

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        self._prompt_tools = [columns.decoded_list(x.get("tools")) for x in inputs]
        out = super()._generate_and_score_completions(inputs)
        self._log_reward_parts(len(inputs))
        if self.composer_kl_coef > 0:
            self._apply_k1_in_reward(out)
        mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        pad = encoding.pad_id(tok)
        if self.alpha_sdpo > 0:
            hints = self._row_hints(inputs)
            if any(hints):
                rows = [
                    self._tokenize_prompt(self._prompt_with_hint(x["prompt"], h) if h else x["prompt"], t)
                    for x, h, t in zip(inputs, hints, self._prompt_tools)
                ]
                ids = encoding.pad_rows(rows, pad, left=True)
                pmask = encoding.pad_rows([[1] * len(r) for r in rows], 0, left=True)
                row_on = torch.tensor([float(h is not None) for h in hints], device=mask.device)
                out["sdpo_prompt_ids"] = ids.to(mask.device)
                out["sdpo_prompt_mask"] = pmask.to(mask.device)
                out["sdpo_loss_mask"] = mask * row_on[:, None]
                out["sdpo_num_items"] = out["sdpo_loss_mask"].sum()
        if self.beta_replay > 0:
            present = [columns.decoded(x.get("dpo_pair")) for x in inputs]
            first = columns.first_pairs(present)  # one pair counts once per batch
            if any(first):
                dummy = next(p for p in present if p)
                enc = pair_tokens.encode_pairs(tok, [p or dummy for p in present], self.max_dpo_seq_len)
                if self.dpo_variant == "dpo":
                    ref_c, ref_r = self._reference_pair_logps(enc)
                else:  # SimPO is reference-free
                    ref_c = ref_r = torch.zeros(len(enc["pair_ids"]))
                for key in ("dpo_chosen_input_ids", "dpo_chosen_response_mask"):
                    out[key] = enc[key].to(mask.device)
                for key in ("dpo_rejected_input_ids", "dpo_rejected_response_mask"):
                    out[key] = enc[key].to(mask.device)
                out["dpo_chosen_ref_logprobs"] = ref_c.to(mask.device)
                out["dpo_rejected_ref_logprobs"] = ref_r.to(mask.device)
                out["dpo_row_mask"] = torch.tensor(first, dtype=torch.float32, device=mask.device)
                out["dpo_num_items"] = out["dpo_row_mask"].sum()
        return out

    def _log_reward_parts(self, n: int) -> None:
        """A shaped reward's ``last_parts`` means as ``reward_parts/<part>``, ``last_hack_attempts`` too."""
        mode = "train" if self.model.training else "eval"
        for f in self.reward_funcs:
            parts = getattr(f, "last_parts", None)
            scored = [p for p in parts or [] if p] if isinstance(parts, list) and len(parts) == n else []
            for key in scored[0] if scored else ():
                self._metrics[mode][f"reward_parts/{key}"].append(sum(p[key] for p in scored) / len(scored))
            if scored and isinstance(hacks := getattr(f, "last_hack_attempts", None), int):
                self._metrics[mode]["reward_hack_attempts"].append(float(hacks))

    @torch.no_grad()
    def _apply_k1_in_reward(self, out: dict[str, Any]) -> None:
        """Composer-faithful KL: A <- A - c·(k1 - mean_group k1), k1 = Σ_t (log π_θ - log π_ref)."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        att = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        keep = out["completion_ids"].size(1)
        logp, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, att, keep)
        ref, ctx = self._ref_forward_context()
        with ctx:
            ref_logp, _, _ = self._get_per_token_logps_and_entropies(ref, ids, att, keep)
        k1 = ((logp - ref_logp) * out["completion_mask"]).sum(-1)
        g = self.num_generations if self.model.training else self.num_generations_eval
        centred = k1 - k1.view(-1, g).mean(1).repeat_interleave(g)
        out["advantages"] = out["advantages"] - self.composer_kl_coef * centred
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["kl_k1/mean"].append(k1.mean().item())

    # ---------------------------------------------------------------- the loss
    @staticmethod
    def _sequence_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, response_mask: torch.Tensor):
        """Summed response log-probs ``(B,)`` (standard DPO accounting), via the loss seam."""
        from composer_replication.loss import sequence_logprobs

        return sequence_logprobs(model, input_ids, response_mask)

    def _channel_scale(
        self, local_count: torch.Tensor, generation_count: torch.Tensor | None
    ) -> torch.Tensor:
        """Divide a channel's local sum by this to match TRL's scaling for the active loss_type."""
        train = self.model.training
        if self.loss_type in _GLOBAL_NORM and generation_count is not None:
            n = generation_count.clamp(min=1.0) / self.accelerator.num_processes
            if train:
                n = n * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            return n
        ga = self.current_gradient_accumulation_steps if train else 1
        return local_count.clamp(min=1.0) * ga

    def _compute_sdpo_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """GJSD between the student and the hinted teacher on the completion tokens (loss.sdpo_channel)."""
        zero = inputs["completion_ids"].new_zeros((), dtype=torch.float32).requires_grad_()
        if self.alpha_sdpo == 0 or "sdpo_prompt_ids" not in inputs:
            return zero
        mask = inputs["sdpo_loss_mask"]
        rows = mask.sum(-1) > 0
        if not bool(rows.any()):
            return zero
        comp, cmask, m = inputs["completion_ids"][rows], inputs["completion_mask"][rows], mask[rows]
        s_prompt, t_prompt = inputs["prompt_ids"][rows], inputs["sdpo_prompt_ids"][rows]
        res = self.loss.sdpo(
            model,
            torch.cat([s_prompt, comp], 1),
            torch.cat([t_prompt, comp], 1),
            torch.cat([torch.zeros_like(t_prompt), m.long()], 1),
            student_mask=torch.cat([torch.zeros_like(s_prompt), m.long()], 1),
            attention_mask=torch.cat([inputs["prompt_mask"][rows], cmask], 1),
            teacher_attention_mask=torch.cat([inputs["sdpo_prompt_mask"][rows], cmask], 1),
            taid_t=self.sdpo_taid.t if self.sdpo_taid is not None else None,
        )
        self._channel_metrics.update(res.metrics)
        if self.sdpo_taid is not None and self.model.training:
            self._taid_losses.append(float(res.loss.detach()))
            self._channel_metrics["sdpo/taid_t"] = self.sdpo_taid.t
        n = torch.tensor(float(res.count), device=res.loss.device)
        return res.loss * n / self._channel_scale(n, inputs.get("sdpo_num_items"))

    def _compute_trace_replay_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """DPO (or SimPO) over the batch's pairs with cached reference log-probs (loss.preference_channel)."""
        zero = inputs["completion_ids"].new_zeros((), dtype=torch.float32).requires_grad_()
        if self.beta_replay == 0 or "dpo_row_mask" not in inputs:
            return zero
        rows = inputs["dpo_row_mask"] > 0
        if not bool(rows.any()):
            return zero
        res = self.loss.preference(
            model,
            inputs["dpo_chosen_input_ids"][rows],
            inputs["dpo_chosen_response_mask"][rows],
            inputs["dpo_rejected_input_ids"][rows],
            inputs["dpo_rejected_response_mask"][rows],
            ref_chosen_logps=inputs["dpo_chosen_ref_logprobs"][rows],
            ref_rejected_logps=inputs["dpo_rejected_ref_logprobs"][rows],
        )
        self._channel_metrics.update(res.metrics)
        n = torch.tensor(float(res.count), device=res.loss.device)
        return res.loss * n / self._channel_scale(n, inputs.get("dpo_num_items"))

    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        policy = super()._compute_loss(model, inputs)
        if self.alpha_sdpo == 0 and self.beta_replay == 0:
            return policy
        mode = "train" if self.model.training else "eval"
        self._channel_metrics = {}
        sdpo = self._compute_sdpo_loss(model, inputs)
        dpo = self._compute_trace_replay_loss(model, inputs)
        # Logged unscaled (per token / per pair), next to TRL's own metrics.
        for key, value in self._channel_metrics.items():
            self._metrics[mode][key].append(value)
        return self.loss.total(policy, sdpo, dpo)

    # ---------------------------------------------------------------- TAID's schedule
    def _taid_step(self, global_step: int) -> None:
        """After an optimizer step: advance TAID's ``t`` with the step's mean SDPO loss (as the offline
        trainer does); a step without SDPO tokens leaves it as it is."""
        if self._taid_losses:
            self.sdpo_taid.update_t(sum(self._taid_losses) / len(self._taid_losses), global_step=global_step)
            self._taid_losses = []

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.sdpo_taid is not None:  # the schedule's state resumes with the weights
            from composer_replication._io import atomic_write_json

            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            atomic_write_json(os.path.join(folder, _TAID_STATE), self.sdpo_taid.state_dict())

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        path = os.path.join(resume_from_checkpoint, _TAID_STATE)
        if self.sdpo_taid is not None and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.sdpo_taid.load_state_dict(json.load(f))


_TAID_STATE = "taid_state.json"


class _TAIDStep(TrainerCallback):
    def __init__(self, trainer: ComposerReplicationTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.trainer._taid_step(state.global_step)
        return control
