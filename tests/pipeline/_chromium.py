"""Open a page in headless Chromium and read what its own script recorded about its images."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"


def chromium_available() -> bool:
    return Path(CHROMIUM).exists() or shutil.which("chromium") is not None


def images_loaded(html: Path) -> tuple[int, int]:
    """(decoded images, all images) as the report's load handler counted them in a real browser."""
    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", "--dump-dom", html.resolve().as_uri()],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    m = re.search(r'data-images="(\d+)/(\d+)"', proc.stdout)
    assert m, f"the page's load handler did not run; chromium said: {proc.stderr[-2000:]}"
    return int(m.group(1)), int(m.group(2))
