"""Run under torchrun (2 gloo processes): the three-channel loss through ``DistributedEngine`` (FSDP2) on
the fused-linear path (hidden states + head, as ``auto`` picks for large vocabularies), against the same
loss on an unsharded copy in one process. Prints one JSON line from rank 0."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from composer_replication.config import build_config
from composer_replication.kernels.hf import resolve_logits_mode, set_default_logits_mode
from composer_replication.loss import compose_loss
from composer_replication.models import build_tiny_model, build_tiny_tokenizer
from composer_replication.trainer import data as od
from composer_replication.trainer.distributed import engine as distributed
from composer_replication.trainer.pair_tokens import pair_batch, reference_logprobs


def main(data_dir: str) -> None:
    set_default_logits_mode("fused", min_vocab=1)
    sdpo = {"source": "recorded"}  # FSDP2 refuses on_policy (the default)
    cfg = build_config(
        {
            "data": {"traces": f"{data_dir}/traces.jsonl"},
            "distributed": {"strategy": "fsdp2"},
            "loss": {"sdpo": sdpo},
        }
    )
    engine = distributed.setup(cfg)
    tok = build_tiny_tokenizer(2048)
    traces = od.load_rows(f"{data_dir}/traces.jsonl")[:2]
    pairs = od.load_rows(f"{data_dir}/pairs.jsonl")[:2]
    reference = build_tiny_model(tokenizer=tok, seed=0)
    batch = od.trace_batch(od.make_collator(tok, 256, 128, True), traces)
    batch.update(pair_batch(tok, pairs, reference_logprobs(reference, tok, pairs, 128), 128, "cpu"))
    kw = {"alpha_sdpo": 1.0, "beta_replay": 1.0}
    want = compose_loss(reference, batch, **kw)
    want.total.backward()
    model = engine.prepare(build_tiny_model(tokenizer=tok, seed=0))
    from composer_replication.loss import ComposedLoss

    loss_fn = ComposedLoss.from_config({"sdpo": {"weight": 1.0}, "preference": {"weight": 1.0}})
    got = engine.loss(model, batch, loss_fn)  # every rank the same batch: the averaged gradient is the same
    got.total.backward()
    ref_grads = dict(reference.named_parameters())
    worst = max(
        float((p.grad.full_tensor() - ref_grads[n].grad).abs().max() / ref_grads[n].grad.abs().max())
        for n, p in model.named_parameters()
    )
    path = resolve_logits_mode(engine.unsharded(model), None, batch["input_ids"])[0]
    if engine.is_main:
        print(
            json.dumps(
                {"want": want.detached(), "got": got.detached(), "worst_grad_rel": worst, "path": path}
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
