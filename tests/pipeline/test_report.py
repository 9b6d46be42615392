"""The report renders in a real browser: every plot it references decodes."""

from __future__ import annotations

import pytest

from composer_replication.pipeline.manifest import Manifest
from composer_replication.pipeline.report import write_report

from ._chromium import chromium_available, images_loaded
from ._report_run import fake_run

pytestmark = pytest.mark.skipif(
    not chromium_available(), reason="chromium not installed (scripts/setup.sh installs it)"
)


def test_every_plot_loads_in_headless_chromium(tmp_path):
    fake_run(tmp_path)
    html = write_report(tmp_path, title="t <script>")
    plots = sorted(p.name for p in html.parent.glob("*.png"))
    assert plots == [
        "eval.png",
        "losses_grpo.png",
        "losses_offline.png",
        "pairs_per_teacher.png",
        "reward.png",
        "spend.png",
    ]
    text = html.read_text()
    assert "t &lt;script&gt;" in text  # titles are escaped
    assert all(f'src="{p}"' in text for p in plots)  # relative paths: the folder is self-contained
    assert images_loaded(html) == (6, 6)
    # the check can fail: a plot that is missing on disk is counted as not loaded
    (html.parent / "reward.png").unlink()
    assert images_loaded(html) == (5, 6)


def test_report_of_an_empty_run_has_no_broken_images(tmp_path):
    Manifest(tmp_path).save()
    html = write_report(tmp_path)
    assert images_loaded(html) == (0, 0)
    assert "No teacher calls" in html.read_text()
