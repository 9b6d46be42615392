"""Held-out evaluation for the offline trainer (no gradients).

- ``eval/lm_ce``: CE on the held-out traces' assistant tokens.
- ``eval/sdpo_jsd``: generalized JSD (beta 0.5) between the student and the hinted teacher at the
  held-out error sites; falling means the student absorbed the hints.
- ``eval/pref_accuracy``: fraction of held-out pairs whose chosen log-ratio (policy minus the initial
  weights) is above the rejected one; 0 at step 0 by construction (both ratios are 0).
- ``eval/pref_accuracy_raw``: fraction whose length-normalised chosen log-prob is above the rejected
  one (no reference; has a meaningful starting value). ``eval/pref_margin``: mean log-ratio margin.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def evaluate(model, tok, cfg, traces: list[dict], pairs: list[dict], ref: dict, collator) -> dict[str, float]:
    from composer_replication.loss import compose_loss, sequence_logprobs
    from composer_replication.trainer import data as od
    from composer_replication.trainer import pair_tokens

    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    out: dict[str, Any] = {}
    bs = max(1, cfg.schedule.batch_size)
    ce, jsd, n_ce, n_jsd = 0.0, 0.0, 0, 0
    for i in range(0, len(traces), bs):
        batch = {k: v.to(dev) for k, v in od.trace_batch(collator, traces[i : i + bs]).items()}
        comps = compose_loss(model, batch, alpha_sdpo=1.0, beta_replay=0.0)
        m = comps.metrics
        ce += m.get("lm_ce/loss", 0.0) * m.get("lm_ce/tokens", 0.0)
        n_ce += int(m.get("lm_ce/tokens", 0))
        if m.get("sdpo/tokens"):
            jsd += m["sdpo/loss"] * m["sdpo/tokens"]
            n_jsd += int(m["sdpo/tokens"])
    if n_ce:
        out["eval/lm_ce"] = ce / n_ce
    if n_jsd:
        out["eval/sdpo_jsd"] = jsd / n_jsd
        out["eval/sdpo_tokens"] = n_jsd
    if pairs:
        acc, raw, margin = [], [], []
        for i in range(0, len(pairs), bs):
            enc = pair_tokens.encode_pairs(tok, pairs[i : i + bs], cfg.data.max_dpo_seq_len)
            lp, avg = {}, {}
            for side in ("chosen", "rejected"):
                ids = enc[f"dpo_{side}_input_ids"].to(dev)
                mask = enc[f"dpo_{side}_response_mask"].to(dev)
                lp[side] = sequence_logprobs(model, ids, mask).float().cpu()
                avg[side] = lp[side] / mask[:, 1:].sum(-1).clamp(min=1).float().cpu()
            refs = torch.tensor([ref[p] for p in enc["pair_ids"]], dtype=torch.float32)
            diff = (lp["chosen"] - refs[:, 0]) - (lp["rejected"] - refs[:, 1])
            acc += (diff > 0).float().tolist()
            margin += diff.tolist()
            raw += (avg["chosen"] > avg["rejected"]).float().tolist()
        out["eval/pref_accuracy"] = sum(acc) / len(acc)
        out["eval/pref_accuracy_raw"] = sum(raw) / len(raw)
        out["eval/pref_margin"] = sum(margin) / len(margin)
        out["eval/pairs"] = len(pairs)
    model.train(was_training)
    return out
