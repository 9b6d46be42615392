"""A missing optional dependency is named by its pip extra, everywhere (``composer_replication._extras``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from composer_replication._extras import EXTRAS, MissingExtraError, is_available, require

ROOT = Path(__file__).resolve().parents[2]


def test_every_extra_named_in_code_is_declared_in_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(set(EXTRAS) - set(declared)) == []


def test_require_names_the_extra_and_the_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # what an uninstalled package looks like
    assert not is_available("kubernetes")
    with pytest.raises(
        MissingExtraError,
        match=r'the eks backend needs kubernetes: pip install "composer-replication\[eks\]"',
    ) as info:
        require("eks", purpose="the eks backend")
    assert isinstance(info.value, ImportError)
    assert (info.value.extra, info.value.name) == ("eks", "kubernetes")


def test_require_checks_only_the_modules_asked_for(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    require("replay", "httpx")  # httpx is installed: no error
    with pytest.raises(
        MissingExtraError, match=r"aiohttp is not installed: pip install \"composer-replication\[replay\]\""
    ):
        require("replay")


def test_unknown_extra_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        require("nope")


def test_plots_name_the_plot_extra(monkeypatch, tmp_path):
    from composer_replication.trainer.plots import plot_losses

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"composer-replication\[plot\]"):
        plot_losses(tmp_path / "metrics.jsonl", tmp_path / "x.png")


def test_report_to_names_the_tracker_extra(monkeypatch, tmp_path):
    from composer_replication.trainer.trackers import open_trackers

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        MissingExtraError, match=r'report_to=wandb needs wandb: pip install "composer-replication\[wandb\]"'
    ):
        open_trackers(["wandb"], tmp_path, {})


_WITHOUT_TRL = textwrap.dedent(
    """
    import sys
    for name in ("trl", "peft"):
        sys.modules[name] = None  # as if the trl extra were not installed
    from composer_replication import ComposerReplicationTrainer
    from composer_replication.trainer import make_po_config
    for build in (lambda: ComposerReplicationTrainer(model=None, args=None), make_po_config):
        try:
            build()
        except ImportError as exc:
            print(type(exc).__name__, exc)
        else:
            print("no error")
    """
)


def test_trainer_without_trl_names_the_extra():
    """Without TRL the trainer class still imports, and building it says what to install (not an
    ``object.__init__()`` TypeError from a fallback base class)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRL], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines == [
        'MissingExtraError ComposerReplicationTrainer needs trl: pip install "composer-replication[trl]"',
        'MissingExtraError make_po_config needs trl: pip install "composer-replication[trl]"',
    ]


def test_lazy_exports_reads_like_imports_and_refuses_a_name_twice():
    from composer_replication._extras import lazy_attr, lazy_exports

    table = lazy_exports({"composer_replication._io": ("atomic_write_json",), "json": ("dumps", "loads")})
    assert table == {"atomic_write_json": "composer_replication._io", "dumps": "json", "loads": "json"}
    namespace = {"__name__": "pkg"}
    from composer_replication._io import atomic_write_json

    assert lazy_attr(namespace, table, "atomic_write_json") is atomic_write_json
    assert namespace["atomic_write_json"] is atomic_write_json  # cached: the next access skips __getattr__
    with pytest.raises(ValueError, match="'dumps' is exported from both 'json' and 'simplejson'"):
        lazy_exports({"json": ("dumps",), "simplejson": ("dumps",)})
    with pytest.raises(AttributeError, match="module 'pkg' has no attribute 'nope'"):
        lazy_attr(namespace, table, "nope")
