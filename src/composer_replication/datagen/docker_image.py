"""Build the docker sandbox image locally, with no registry: a root file system assembled from the host.

What is covered: `build_rootfs` writes a tar of a minimal root file system made of *this host's* files —
the running Python (interpreter, ``libpython``, the standard library without its test suites and GUI
modules), pytest and its dependencies from site-packages, ``bash`` and the usual command-line tools
(coreutils, grep, sed, find, diff, awk when present), each with the shared libraries ``ldd`` names, plus a
minimal ``/etc`` (``passwd``/``group`` with root and nobody only; no shadow, no keys, no resolver).
`ensure_image` loads that tar with ``docker import`` as `SANDBOX_IMAGE` and labels it with a digest of its
inputs, so a rebuild happens only when the host's files change. Tasks therefore run under the same Python
and pytest in the docker sandbox as in the bubblewrap one, and CI never pulls an image.

What is not covered: the image is for the host's CPU architecture and C library only; nothing is
installed from a package index, so tasks needing third-party packages besides pytest need their own image
(``DockerSandbox(image=...)``).

CLI: ``python3 -m composer_replication.datagen.docker_image [--tag T] [--force]`` (used by
``scripts/test.sh``); it prints the tag.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

SANDBOX_IMAGE = f"composer-replication/sandbox:py{sys.version_info.major}.{sys.version_info.minor}"
DIGEST_LABEL = "composer-replication.rootfs-digest"
PY_PREFIX = "/usr/local"  # where the interpreter lives inside the image
TOOLS = (
    "bash sh cat cp mv rm ls mkdir rmdir touch ln chmod echo env id head tail wc sort uniq cut tr tee "
    "dirname basename realpath readlink timeout sleep true false pwd date stat du grep sed find xargs "
    "diff cmp awk printf seq nproc uname whoami mktemp expr md5sum sha256sum test"
).split()
PYTHON_DISTS = ("pytest",)  # and their requirements, recursively
_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
_DYNLOAD_SKIP = re.compile(r"^_tkinter")
_ETC = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/workspace:/bin/bash\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "etc/hostname": "sandbox\n",
    "etc/hosts": "127.0.0.1 localhost sandbox\n",
}


def _ldd(paths: Iterable[str]) -> set[str]:
    """Shared libraries (absolute paths, the loader included) the given ELF files need."""
    libs: set[str] = set()
    for p in paths:
        r = subprocess.run(["ldd", p], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                libs.add(m.group(1))
    return libs


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _dist_files(names: Iterable[str]) -> dict[str, str]:
    """site-packages files (arcname -> host path) of the distributions and their requirements."""
    from packaging.requirements import Requirement

    site = Path(sysconfig.get_paths()["purelib"])
    out: dict[str, str] = {}
    seen: set[str] = set()
    todo = list(names)
    while todo:
        req = Requirement(todo.pop())
        name = req.name.lower().replace("_", "-")
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        dist = metadata.distribution(name)
        todo += dist.requires or []
        for f in dist.files or []:
            host = Path(str(dist.locate_file(f))).resolve()
            if host.is_file() and site in host.parents and "__pycache__" not in f.parts:
                rel = host.relative_to(site).as_posix()
                out[
                    f"{PY_PREFIX[1:]}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages/{rel}"
                ] = str(host)
    return out


def plan_rootfs() -> tuple[dict[str, str], dict[str, str]]:
    """(files: arcname -> host path, symlinks: arcname -> target) of the image's root file system."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix)
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    exe = Path(sys.executable).resolve()
    files[f"{PY_PREFIX[1:]}/bin/python{ver}"] = str(exe)
    links[f"{PY_PREFIX[1:]}/bin/python3"] = f"python{ver}"
    links[f"{PY_PREFIX[1:]}/bin/python"] = f"python{ver}"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for dirpath, dirnames, filenames in os.walk(stdlib):
        rel_dir = Path(dirpath).relative_to(stdlib)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP and not d.startswith("config-")]
        for fn in filenames:
            if rel_dir.name == "lib-dynload" and _DYNLOAD_SKIP.match(fn):
                continue
            host = Path(dirpath) / fn
            if host.is_file() and not host.is_symlink():
                files[f"{PY_PREFIX[1:]}/lib/python{ver}/{(rel_dir / fn).as_posix()}"] = str(host)
    files.update(_dist_files(PYTHON_DISTS))
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found:
            real = os.path.realpath(found)
            files[f"usr/bin/{tool}"] = real
    elves = sorted({p for p in files.values() if _is_elf(p)})
    needed = _ldd(elves)
    # The interpreter's RUNPATH names the host prefix: put libpython where the loader looks by default,
    # next to the C library.
    libc_dir = next(
        os.path.dirname(os.path.realpath(p)) for p in needed if os.path.basename(p) == "libc.so.6"
    )
    for lib in sorted(needed):
        if lib.startswith(str(base)):
            files[os.path.join(libc_dir, os.path.basename(lib)).lstrip("/")] = os.path.realpath(lib)
            continue
        real = os.path.realpath(lib)
        # Keep the loader's and sonames' paths as the host has them (merged /usr: /lib -> usr/lib).
        files[real.lstrip("/")] = real
        logical = os.path.join(os.path.realpath(os.path.dirname(lib)), os.path.basename(lib))
        if logical != real:
            links[logical.lstrip("/")] = real
    for top in ("bin", "sbin", "lib", "lib64", "lib32"):
        host = Path("/") / top
        if host.is_symlink():
            links[top] = os.readlink(host)
    return files, links


def rootfs_digest(files: dict[str, str], links: dict[str, str]) -> str:
    """A digest of every input (names, sizes, mtimes, link targets, the /etc text): equal digest, equal image."""
    h = hashlib.sha256()
    for arc in sorted(files):
        st = os.stat(files[arc])
        h.update(f"{arc}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode & 0o777}\n".encode())
    for arc in sorted(links):
        h.update(f"L{arc}\0{links[arc]}\n".encode())
    for arc in sorted(_ETC):
        h.update(f"E{arc}\0{_ETC[arc]}\n".encode())
    return h.hexdigest()[:16]


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def build_rootfs(out: str | os.PathLike[str]) -> str:
    """Write the root file system tar to ``out``; return its digest (see `rootfs_digest`)."""
    files, links = plan_rootfs()
    digest = rootfs_digest(files, links)
    made: set[str] = set()

    def parents(tar: tarfile.TarFile, arc: str) -> None:
        parts = arc.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in made and d not in links:
                made.add(d)
                _add_dir(tar, d)

    with tarfile.open(out, "w") as tar:
        for d, mode in (("tmp", 0o1777), ("workspace", 0o777), ("root", 0o700), ("proc", 0o555)):
            made.add(d)
            _add_dir(tar, d, mode)
        for d in ("dev", "sys", "etc", "usr", "usr/bin"):
            made.add(d)
            _add_dir(tar, d)
        for arc, target in sorted(links.items()):
            if "/" not in arc:
                info = tarfile.TarInfo(arc)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
        for arc, text in sorted(_ETC.items()):
            data = text.encode()
            info = tarfile.TarInfo(arc)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for arc, host in sorted(files.items()):
            parents(tar, arc)
            info = tar.gettarinfo(host, arcname=arc)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with open(host, "rb") as f:
                tar.addfile(info, f)
        for arc, target in sorted(links.items()):
            if "/" in arc:
                parents(tar, arc)
                info = tarfile.TarInfo(arc)
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
    return digest


def image_digest(tag: str = SANDBOX_IMAGE, executable: str = "docker") -> str | None:
    """The rootfs digest label of a local image, or None when the image is absent."""
    r = subprocess.run(
        [executable, "image", "inspect", "--format", f'{{{{index .Config.Labels "{DIGEST_LABEL}"}}}}', tag],
        capture_output=True,
        text=True,
    )
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_image(tag: str = SANDBOX_IMAGE, *, executable: str = "docker", force: bool = False) -> str:
    """Build and ``docker import`` the sandbox image unless an up-to-date one is present; return the tag.

    Raises ``RuntimeError`` naming the failing command when docker refuses.
    """
    import tempfile

    files, links = plan_rootfs()
    digest = rootfs_digest(files, links)
    if not force and image_digest(tag, executable) == digest:
        return tag
    with tempfile.TemporaryDirectory(prefix="cr-rootfs-") as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        build_rootfs(tar_path)
        argv = [executable, "import", "--change", f"LABEL {DIGEST_LABEL}={digest}"]
        argv += ["--change", f"ENV PATH={PY_PREFIX}/bin:/usr/bin:/bin", "--change", "ENV LANG=C.UTF-8"]
        argv += ["--change", "WORKDIR /workspace", str(tar_path), tag]
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv[:2])} ... {tag}` failed: {r.stderr.strip()}")
    return tag


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m composer_replication.datagen.docker_image", description=__doc__.split("\n")[0]
    )
    p.add_argument("--tag", default=SANDBOX_IMAGE)
    p.add_argument("--executable", default="docker")
    p.add_argument("--force", action="store_true", help="rebuild even when the image is up to date")
    args = p.parse_args(argv)
    try:
        print(ensure_image(args.tag, executable=args.executable, force=args.force))
    except (RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
