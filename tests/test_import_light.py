"""``import composer_replication`` stays light (api_reference §1; team brief).

One fresh interpreter imports the package in stages and records, after each stage, which heavy
optional dependencies have entered ``sys.modules``. The stages are cumulative, so a later stage's
check is at least as strict as the brief asks for that import alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Top-level module names of the optional heavy dependencies (torchmonarch installs ``monarch``;
# py-data-juicer installs ``data_juicer``; the HF Jobs API lives in ``huggingface_hub._jobs_api``).
HEAVY = (
    "trl",
    "httpx",
    "torchft",
    "data_juicer",
    "modal",
    "sagemaker",
    "kubernetes",
    "huggingface_hub._jobs_api",
    "boto3",
    "ray",
    "monarch",
)

# §1 re-export table (the names ``__all__`` must list).
REEXPORTS = (
    "compose_loss",
    "LossComponents",
    "build_batch",
    "generalized_jsd_loss",
    "ClaudeCodeIngester",
    "IngestionStats",
    "SYSTEM_PROMPT",
    "DEFAULT_TEACHERS",
    "DPOPair",
    "TeacherCallResult",
    "TeacherSpec",
    "TraceState",
    "extract_dpo_pairs",
    "replay_trace",
    "ComposerReplicationTrainer",
    "make_diloco_outer_loop",
)

_PROBE = textwrap.dedent(
    """
    import json, sys
    HEAVY = %r
    def loaded(names):
        return sorted(n for n in names if n in sys.modules)
    out = {}
    import composer_replication as c
    out["version"] = c.__version__
    out["diloco_available"] = c._DILOCO_AVAILABLE
    out["all"] = list(c.__all__)
    c.SYSTEM_PROMPT, c.compose_loss
    out["package"] = loaded(HEAVY)
    import composer_replication.teacher_replay
    out["teacher_replay"] = loaded(HEAVY)
    import composer_replication.trainer
    out["trainer"] = loaded(HEAVY)
    import composer_replication.trainer.data_collator
    out["data_collator"] = loaded(HEAVY)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONSTARTUP")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE % (HEAVY,)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path_factory.mktemp("import-light"),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_package_import_is_light(probe):
    """``import composer_replication`` + ``__version__``, ``_DILOCO_AVAILABLE``, ``SYSTEM_PROMPT``,
    ``compose_loss`` pull in none of the heavy optional dependencies."""
    assert probe["package"] == [], f"imported by the package: {probe['package']}"


def test_teacher_replay_import_has_no_httpx(probe):
    assert "httpx" not in probe["teacher_replay"], probe["teacher_replay"]


@pytest.mark.parametrize("stage", ["trainer", "data_collator"])
def test_trainer_imports_have_no_trl(probe, stage):
    assert "trl" not in probe[stage], f"composer_replication.{stage}: {probe[stage]}"


def test_version(probe):
    assert probe["version"] == "0.1.0"


def test_all_lists_every_reexport(probe):
    missing = [n for n in REEXPORTS if n not in probe["all"]]
    assert not missing, f"__all__ lacks {missing}"


def test_diloco_outer_loop_is_none_iff_torchft_missing():
    import importlib.util

    import composer_replication

    has_torchft = importlib.util.find_spec("torchft") is not None
    assert composer_replication._DILOCO_AVAILABLE is has_torchft
    assert (composer_replication.make_diloco_outer_loop is None) is (not has_torchft)
    if has_torchft:
        from composer_replication.diloco import make_diloco_outer_loop

        assert composer_replication.make_diloco_outer_loop is make_diloco_outer_loop
