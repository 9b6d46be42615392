"""The offline loop: training on ingested traces and mined pairs, no rollouts (SFT CE + α·SDPO + β·DPO).

- ``loop``: ``train_offline(config, out_dir=...)``, the library entry point of ``train --mode offline``
  and the pipeline's offline phase: checkpoints, metrics, resume, the stop.
- ``stepper``: ``OfflineStepper`` / ``make_offline_stepper``, one optimizer step at a time (what the loop
  and DiLoCo replicas with ``inner: offline`` run).
- ``batch_stepper``: the same step over batches the caller builds (``smoke``, the Monarch recipe).
- ``onpolicy``: on-policy SDPO, the student's own samples at the error sites of the training traces.

It builds on the shared trainer modules (``trainer.prepare``, ``trainer.data``, ``trainer.pair_tokens``,
``trainer.checkpoint``, ``trainer.error_sites``), the ``distributed`` room's engine and the
``evaluation`` room's held-out measurement.
"""
