"""Every option of every command says what it does in `--help`."""

from __future__ import annotations

import argparse
import importlib

import pytest

from composer_replication.cli.main import COMMANDS


def _undocumented(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _undocumented(sub, f"{prefix} {name}")
            continue
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_help(command):
    module = importlib.import_module(f"composer_replication.cli.{COMMANDS[command][0]}")
    parser = argparse.ArgumentParser(prog=f"composer-replication {command}")
    module.add_arguments(parser)
    assert _undocumented(parser, command) == []
