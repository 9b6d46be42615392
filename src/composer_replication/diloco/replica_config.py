"""The replica config's former path: it re-exports ``composer_replication.config.replica`` whole (the
schema and its loader live there)."""

from composer_replication.config.replica import *  # noqa: F403 - the former path re-exports the module whole
from composer_replication.config.replica import __all__ as __all__
