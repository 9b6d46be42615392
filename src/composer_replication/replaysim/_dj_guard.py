"""Keep data-juicer from installing packages while it runs.

data-juicer's ``LazyLoader`` installs any missing module with ``python -m uv pip install`` the moment
an op touches it, and no setting turns that off. uv ignores pip's constraints, so one missing module
can pull a multi-GB CUDA torch into the environment. We replace the install hook with one that fails
with the package's name and the pip command to run, before any data-juicer op is imported.
"""

from __future__ import annotations

from composer_replication._extras import MissingExtraError, require

_MARK = "_composer_replication_guard"


class AutoInstallRefused(ImportError):
    """data-juicer wanted to install a package at run time."""


def _refuse(cls, package_spec, pip_args=None):  # noqa: ARG001 - the hook's signature
    name = str(package_spec).split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip()
    raise AutoInstallRefused(
        f"data-juicer tried to install {package_spec!r} at run time; composer-replication forbids run-time "
        f"installs (uv ignores pip constraints and can replace torch). Install it yourself: "
        f"pip install torch==2.13.0 {name}"
    )


setattr(_refuse, _MARK, True)


def install_guard() -> None:
    """Patch ``data_juicer.utils.lazy_loader.LazyLoader._install_package`` (idempotent)."""
    try:
        require("data-juicer", purpose="the data-juicer normalizer")
    except MissingExtraError as exc:
        raise RuntimeError(str(exc)) from exc  # the API reference promises RuntimeError here
    from data_juicer.utils.lazy_loader import LazyLoader

    current = LazyLoader.__dict__.get("_install_package")
    if getattr(getattr(current, "__func__", None), _MARK, False):
        return
    LazyLoader._install_package = classmethod(_refuse)


def guard_installed() -> bool:
    from data_juicer.utils.lazy_loader import LazyLoader

    return bool(getattr(getattr(LazyLoader.__dict__.get("_install_package"), "__func__", None), _MARK, False))
