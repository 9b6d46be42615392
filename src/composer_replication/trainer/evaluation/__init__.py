"""Evaluation: every measurement of a model, during training and before/after it.

- ``heldout``: the offline loop's held-out metrics (``eval/lm_ce``, ``eval/sdpo_jsd``, preference accuracy).
- ``sites``: ``SiteSet``, recovery CE, JSD to the hinted teacher and greedy valid-action / tool-match rates
  at the error sites of held-out traces; ``frozen_prefix``: the replay of shared decoder layers it uses.
- ``paired``: paired before/after comparisons (``paired``) and ``site_comparison`` of two saved models.
- ``greedy``: greedy answers of a saved model at held-out error states (``GreedyGenerator``, cached) and
  their scores (``evaluate_sites``).
- ``sandbox``: the sandbox pass rate of a saved model on bundled tasks.
- ``tasks``: ``eval TASKS --model A [--model B]``, models and policies on a task set compared task by
  task; ``task_report``: its ``report.html``.

The pipeline's ``evaluate`` and ``eval_tasks_*`` stages and the ``eval`` command call these. The room builds
on the shared trainer modules (``trainer.error_sites``, ``trainer.data``, ``trainer.pair_tokens``) and
reads GRPO's task sets (``trainer.grpo.tasks``).
"""
