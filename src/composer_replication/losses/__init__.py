"""The loss families, one file each: reference, argument checks, row function, chunk plan, engines.

| module | family | public path of the spec |
|---|---|---|
| :mod:`.gjsd` | generalized JSD (GKD / OPSD / SDPO) | ``opsd.generalized_jsd_loss`` |
| :mod:`.taid` | TAID and its adaptive ``t`` schedule | ``distillation.taid_loss``, ``TAIDScheduler`` |
| :mod:`.eopd` | entropy-aware on-policy distillation | ``distillation.entropy_aware_opd_loss`` |
| :mod:`.ce` | cross-entropy and label log-probabilities | ``loss.token_logprobs`` |
| :mod:`.preference` | sigmoid DPO and SimPO | ``distillation.dpo_loss``, ``simpo_loss`` |

Each vocabulary-sized family has one entry ``loss(..., engine="full" | "chunked" | "fused")``: the
float reference on ``(B, T, V)`` logits, the same logits over token chunks
(:mod:`composer_replication.kernels.chunked`), or hidden states plus an LM head with the logits never
built (:mod:`composer_replication.kernels.fused_linear`); every engine gives the reference's values and
gradients. :mod:`.common` holds what the families share (KL, reductions, checks); :mod:`.align` pairs
SDPO's student and teacher tokens. Pure tensor functions, torch only; nothing is imported here.
"""
