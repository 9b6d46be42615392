"""Memory-efficient large-vocabulary loss paths (see docs/large_vocab.md).

- `kernels.chunked`: the reference losses over token chunks, from (B, T, V) logits, never holding
  more than one chunk's (chunk, V) temporaries.
- `kernels.fused_linear`: the same losses from hidden states (B, T, H) and the LM-head weight
  (V, H); the logits never exist.
- `kernels.triton_liger`: optional GPU kernels (Liger-Kernel), checked against the torch path.

Only torch is imported here.
"""

from composer_replication.kernels.chunked import (
    chunked_cross_entropy,
    chunked_entropy_aware_opd_loss,
    chunked_generalized_jsd_loss,
    chunked_taid_loss,
    chunked_token_logprobs,
)
from composer_replication.kernels.fused_linear import (
    LMHead,
    fused_cross_entropy,
    fused_entropy_aware_opd_loss,
    fused_generalized_jsd_loss,
    fused_taid_loss,
    fused_token_logprobs,
)

__all__ = [
    "LMHead",
    "chunked_cross_entropy",
    "chunked_entropy_aware_opd_loss",
    "chunked_generalized_jsd_loss",
    "chunked_taid_loss",
    "chunked_token_logprobs",
    "fused_cross_entropy",
    "fused_entropy_aware_opd_loss",
    "fused_generalized_jsd_loss",
    "fused_taid_loss",
    "fused_token_logprobs",
]
