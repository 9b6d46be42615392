"""GRPO through TRL: the three-channel GRPO-family trainer's configs, builder and runs.

- ``trainer.composer_trainer`` (the API reference's path, part of this room): ``ComposerReplicationTrainer``,
  TRL's ``GRPOTrainer`` + α·SDPO + β·DPO; ``columns``: the extra dataset columns it reads (hints,
  preference pairs) and how they are decoded.
- ``objectives``: the PO presets (``make_po_config``, ``make_dr_grpo_config``).
- ``build``: one builder of the trainer from a ``TrainConfig``, and its run with checkpoints and export.
- ``run``: ``train --mode grpo`` on ingested traces and pairs; ``tasks``: on sandbox coding tasks
  (``grpo.tasks``, shared with the pipeline's online phase); ``scale``: vLLM and multi-process settings.

It builds on the shared trainer modules only (``trainer.prepare``, ``trainer.data``,
``trainer.pair_tokens``, ``trainer.export``, ``trainer.plots``).
"""
