"""Run a model as a coding agent on sandboxed tasks and record the runs as Claude Code sessions."""

from composer_replication.datagen.rollout import add_arguments, run  # noqa: F401
