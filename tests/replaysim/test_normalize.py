"""replaysim: the data-juicer recipe for real, the no-auto-install guard, and skip_dj (replay then
normalise against the loopback server)."""

from __future__ import annotations

import asyncio

import pytest

from composer_replication.replaysim import DJNormalizer, NormalizedDPOPair, replay_and_normalize_trace
from composer_replication.replaysim.normalize import replay_and_normalize_trace_sync
from composer_replication.teacher_replay.fake_server import Reply

from ..teacher_replay._replay_inputs import make_states, make_teachers

READ = '[TOOL_USE] name=Read input={"file_path": "src/app.py"}'
BASH = '[TOOL_USE] name=Bash input={"command": "ls"}'


def _pair(sid, user, chosen, rejected=BASH):
    return {"state_id": sid, "state_messages": [{"role": "user", "content": user}], "chosen": chosen,
            "rejected": rejected, "n_teachers_agreeing": 2}  # fmt: skip


def test_guard_refuses_runtime_install():
    pytest.importorskip("data_juicer")
    from data_juicer.utils.lazy_loader import LazyLoader

    from composer_replication.replaysim._dj_guard import AutoInstallRefused, guard_installed, install_guard

    install_guard()
    assert guard_installed()
    missing = LazyLoader("composer_replication_no_such_module_xyz")
    with pytest.raises(
        AutoInstallRefused, match=r"pip install torch==2.13.0 composer_replication_no_such_module_xyz"
    ):
        missing.anything  # noqa: B018 - attribute access triggers the lazy import
    with pytest.raises(AutoInstallRefused, match="scipy"):
        LazyLoader._install_package("scipy>=1.10")


def test_default_recipe_for_real_attributes_every_drop():
    pytest.importorskip("data_juicer")
    pairs = [
        _pair("s0", "Fix the failing test in tests/test_app.py please", READ),
        _pair("s1", "Fix the failing test in tests/test_app.py please", READ),  # exact duplicate of s0
        _pair("s2", "Fix the failing test in tests/test_app.py, please!", READ),  # near duplicate
        _pair(
            "s3",
            "Add a --verbose flag to the CLI in src/cli.py",
            '[TOOL_USE] name=Grep input={"pattern": "argparse"}',
        ),
        _pair("s4", "Why does CI fail on main but not locally?", "x"),  # too short
        _pair("s5", "Rewrite the README introduction for new users", "a" * 400),  # degenerate repetition
        _pair(
            "s6",
            "Run the linter over the package and report",
            '[TOOL_USE] name=Bash input={"command": "ruff check ."}',
        ),
    ]
    norm = DJNormalizer()
    out = norm.normalize(pairs)
    rep = norm.last_report
    assert [p.state_id for p in out] == ["s0", "s3", "s6"]
    assert rep.records_in == rep.records_out + sum(rep.dropped_by_op.values()) == 7
    assert {d["state_id"]: d["op"] for d in rep.dropped} == {
        "s1": "document_deduplicator",
        "s2": "document_minhash_deduplicator",
        "s4": "text_length_filter",
        "s5": "character_repetition_filter",
    }
    assert out[1].chosen_messages == [{"role": "assistant", "content": pairs[3]["chosen"]}]
    assert out[1].rejected_messages == [{"role": "assistant", "content": BASH}]
    assert out[1].metadata["skipped"] is False and "document_deduplicator" in out[1].metadata["ops"]


def test_recipe_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        DJNormalizer(tmp_path / "missing.yaml")
    pytest.importorskip("data_juicer")
    bad = tmp_path / "bad.yaml"
    bad.write_text("skip_op_error: true\nprocess:\n  - text_length_filter: {min_len: 1}\n")
    with pytest.raises(ValueError, match="skip_op_error"):
        DJNormalizer(bad)
    bad.write_text("process:\n  - no_such_op: {}\n")
    with pytest.raises(ValueError, match="no_such_op"):
        DJNormalizer(bad)


def test_skip_dj_end_to_end_against_loopback(fake_openrouter):
    srv = fake_openrouter
    teachers = make_teachers(srv)
    srv.script = lambda info: Reply(text="I would ask first.") if info.model == "t/c" else Reply(text=READ)
    raw, norm = asyncio.run(
        replay_and_normalize_trace(states=make_states(3), teachers=teachers, max_total_usd=1.0,
                                   normalizer=DJNormalizer(skip_dj=True))
    )  # fmt: skip
    assert len(raw) == 9 and all(r["error"] is None for r in raw)
    assert len(norm) == 3 and all(isinstance(p, NormalizedDPOPair) for p in norm)
    assert all(p.metadata == {"skipped": True} and p.n_teachers_agreeing == 2 for p in norm)
    assert norm[0].chosen_messages[0]["content"] == READ
    raw2, norm2 = replay_and_normalize_trace_sync(
        states=make_states(3), teachers=teachers, max_total_usd=1.0, normalizer=DJNormalizer(skip_dj=True)
    )
    assert [p.state_id for p in norm2] == [p.state_id for p in norm] and len(raw2) == 9
