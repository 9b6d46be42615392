"""The run config's former path: ``RunConfig`` and its loader live in ``composer_replication.config.run``;
every name it exports is importable from here too."""

from composer_replication.config.run import *  # noqa: F403
from composer_replication.config.run import __all__ as __all__
