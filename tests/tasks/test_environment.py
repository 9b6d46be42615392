"""Environments: declared packages the sandbox lacks are installed once (outside the sandbox, here from a local
wheel: no network), cached, and mounted read-only for the checks."""

from __future__ import annotations

import base64
import hashlib
import zipfile

import pytest

from composer_replication.datagen.sandbox import make_sandbox
from composer_replication.tasks import environment as envmod


def make_wheel(folder, name="crtinydep", version="1.0", code="VALUE = 42\n"):
    """A real (minimal) pure-Python wheel, built by hand so that nothing is downloaded."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            data = text.encode()
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return whl


def test_detect_reads_declarations_only():
    files = {
        "requirements-dev.txt": b"pytest>=7  # already here\ncrtinydep==1.0\n-e .\n# comment\n",
        "pyproject.toml": b'[project]\nname="x"\ndependencies=["crtinydep"]\n[project.optional-dependencies]\ntest=["crother"]\n',
        "setup.py": b"raise SystemExit('never run')\n",
    }
    env = envmod.detect(files)
    assert env.kind == "python" and env.packages == ["crtinydep==1.0", "crtinydep", "crother"]
    assert envmod.detect({"package.json": b"{}"}).kind == "node"
    assert envmod.detect({"README.md": b"x"}).kind == "none"
    assert envmod.detect({"a.py": b"import os\n"}).packages == []


def test_prepare_installs_once_and_the_sandbox_reads_it_read_only(tmp_path):
    wheels = make_wheel(tmp_path / "wheels").parent
    cache = tmp_path / "cache"
    env = envmod.Environment("python", ["crtinydep"])
    envmod.prepare(env, cache, pip_args=["--no-index", "--find-links", str(wheels)])
    assert env.error == "" and (tmp_path / "cache").exists()
    again = envmod.Environment("python", ["crtinydep"])
    for w in wheels.iterdir():
        w.unlink()  # a second prepare must not install (nothing left to install from)
    envmod.prepare(again, cache, pip_args=["--no-index", "--find-links", str(wheels)])
    assert again.site == env.site
    spec = envmod.sandbox_spec(env, "bwrap")
    with spec() as sb:
        run = "PYTHONPATH=/opt/task-env/site python3 -c 'import crtinydep; print(crtinydep.VALUE)'"
        r = sb.exec(f"{run}; touch /opt/task-env/site/x", timeout=30)
        bare = make_sandbox("bwrap")
    assert r.output.startswith("42") and r.returncode != 0  # importable, not writable
    with bare as sb:
        assert sb.exec(run, timeout=30).returncode != 0  # the control: not there without the mount
    assert envmod.task_env(env) == {"PYTHONPATH": "/opt/task-env/site"}


def test_a_failed_build_is_reported_and_cached(tmp_path):
    env = envmod.Environment("python", ["cr-no-such-package"])
    envmod.prepare(env, tmp_path, pip_args=["--no-index", "--find-links", str(tmp_path)])
    assert env.error.startswith("environment build failed: pip install cr-no-such-package")
    again = envmod.Environment("python", ["cr-no-such-package"])
    envmod.prepare(again, tmp_path)
    assert again.error == env.error


@pytest.mark.parametrize(
    "binds", [{"relative": "/opt/x"}, {"/": "/usr/x"}, {"/": "/opt"}, {"/": "/opt/../etc"}]
)
def test_read_only_binds_are_checked(binds):
    with pytest.raises(ValueError, match="bind"):
        make_sandbox("bwrap", ro_binds=binds)
