"""Data-parallel offline training: several processes training as one.

- ``engine``: ``Engine`` (one process) and ``DistributedEngine`` (DDP or FSDP2), the data sharding, the
  metrics reduction and the sharded checkpoints; ``setup(cfg)`` picks one.
- ``launch``: the launcher's environment, the rendezvous and ``train --nproc N``.

It builds on the shared trainer modules only (``trainer.checkpoint``, ``trainer.pair_tokens``).
"""
