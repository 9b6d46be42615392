"""The ``composer-replication`` console script: one thin subcommand per stage (see ``main.py``)."""
