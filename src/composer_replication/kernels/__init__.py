"""Generic machinery for memory-efficient large-vocabulary losses (see docs/large_vocab.md).

- `kernels.chunked`: the token-chunked engine: a family's row function over chunks of (N, V) logits
  rows, never holding more than one chunk's (chunk, V) temporaries.
- `kernels.fused_linear`: the fused-linear engine: the same row functions from hidden states (N, H)
  and the LM-head weight (V, H); the logits never exist. `LMHead` describes the projection.
- `kernels.analytic`: the closed-form value-and-gradient protocol and its in-place tile helpers.
- `kernels.allocator`: keeps freed tiles from lingering in glibc's heap (CPU).
- `kernels.hf`: hidden states and LM head of a Hugging Face causal LM; the ``logits_mode`` choice.
- `kernels.triton_liger`: optional GPU kernels (TRL, Liger-Kernel), checked against the torch path.

Nothing here knows which loss it computes: the loss families (reference, row function, plan and
``loss(..., engine=)``) are in `composer_replication.losses`. Only torch is imported here.
"""

from composer_replication.kernels.chunked import chunked_rows, default_chunk_rows, reduce_rows
from composer_replication.kernels.fused_linear import (
    LMHead,
    default_fused_chunk_rows,
    fused_rows,
    reduce_fused,
)

__all__ = [
    "LMHead",
    "chunked_rows",
    "default_chunk_rows",
    "default_fused_chunk_rows",
    "fused_rows",
    "reduce_fused",
    "reduce_rows",
]
