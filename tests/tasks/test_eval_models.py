"""`eval --model`: models as policies on a mined-style task set, each attempt a rollout in the task's harness
scored by the verifier. A base model against a LoRA adapter trained here writes the paired table and the
report; a model behind the loopback OpenAI-protocol server runs in each task's own harness (Claude Code,
Codex) and leaves session logs; an endpoint that fails is an infrastructure failure, never a score."""

from __future__ import annotations

import json
import shutil

import pytest
from _taskdir import TASKS, write_tasks

from composer_replication.cli.main import main
from composer_replication.datagen.apply_patch import add_files_patch
from composer_replication.datagen.rollout import task_prompt
from composer_replication.datagen.tasks import load_task
from composer_replication.datagen.tools import parse_tool_calls
from composer_replication.ingestion.claude_code import ClaudeCodeIngester
from composer_replication.ingestion.codex import CodexIngester
from composer_replication.trainer.evaluation.tasks import compare
from composer_replication.wire import format_tool_use

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return write_tasks(tmp_path_factory.mktemp("tasks") / "T")


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, task_dir, tiny_model_dir):
    """A LoRA adapter over the tiny model, trained to answer fix-sub's opening prompt with the fix."""
    pytest.importorskip("peft")
    from _taskdir import train_to_answer
    from peft import LoraConfig, get_peft_model

    from composer_replication.models import load_model_and_tokenizer
    from composer_replication.trainer.export import export_model

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    task = load_task(task_dir / "fix-sub")
    answer = format_tool_use(
        "Write", {"file_path": "calc.py", "content": TASKS["fix-sub"]["solution"]["calc.py"]}
    )
    train_to_answer(peft, tok, task_prompt(task), answer)
    out = tmp_path_factory.mktemp("adapter") / "final"
    exported = export_model(peft, tok, out, base_dir=tiny_model_dir)
    assert exported.adapter
    return out


def test_base_against_a_trained_adapter_writes_the_paired_table_and_report(
    task_dir, adapter_dir, tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "eval"
    code = main(["eval", str(task_dir), "--model", str(tiny_model_dir), "--model", str(adapter_dir),
                 "--policy", "noop", "--max-turns", "1", "--max-new-tokens", "96",
                 "--out", str(out), "--sandbox", "bwrap"])  # fmt: skip
    assert code == 0
    result = json.loads((out / "eval.json").read_text())
    noop, base, tuned = result["policies"]
    assert [p["kind"] for p in result["policies"]] == ["built-in", "model", "model"]
    assert noop["pass@1"] == 0.0 and base["pass@1"] == 0.0 and base["infra_failures"] == 0
    rows = {r["task"]: r for r in tuned["rows"]}
    assert rows["fix-sub"]["solved"] == 1 and rows["fix-mul"]["solved"] == 0
    assert tuned["pass@1"] == 0.5 and tuned["infra_failures"] == 0 and tuned["tokens"] > 0
    assert all(r["turns"] == 1 and r["end_reasons"] for r in tuned["rows"])
    (c,) = result["comparisons"]
    assert (c["a"], c["b"], c["n_tasks"]) == (str(tiny_model_dir), str(adapter_dir), 2)
    assert c["pass@1"]["delta"] == 0.5 and c["pass@1"]["n"] == 2
    lo, hi = c["pass@1"]["delta_ci95"]
    assert lo < 0.5 < hi  # t(1 df) = 12.706 over two tasks: a wide interval
    assert {r["task"]: r["pass@1_b"] - r["pass@1_a"] for r in c["rows"]} == {"fix-sub": 1.0, "fix-mul": 0.0}
    # every attempt left a session log in its harness's format (Claude Code: the four sandbox tools' log)
    logs = sorted(p.name for p in (out / "rollouts").rglob("*.jsonl"))
    assert logs.count("fix-sub-000.jsonl") == 2 and len(logs) == 4
    assert (out / tuned["rollouts"] / "fix-sub-000.jsonl").is_file() and base["rollouts"] != tuned["rollouts"]
    page = (out / "report.html").read_text()
    assert "pass_vs_tokens.png" in page and "against" in page and "fix-mul" in page
    assert (out / "pass_vs_tokens.png").stat().st_size > 0
    assert "pass@1 +0.500" in capsys.readouterr().out


def _solver(info):
    """A loopback model that solves each task with the tools its request offers: Codex's patch, or Claude
    Code's read then write."""
    from composer_replication.teacher_replay.fake_server import Reply

    messages, offered = info.body["messages"], [t["function"]["name"] for t in info.body.get("tools", [])]
    done = sum(m["role"] == "assistant" for m in messages)
    name = next(n for n, t in TASKS.items() if t["instruction"] in str(messages[1]["content"]))
    fix = TASKS[name]["solution"]
    if "apply_patch" in offered:
        steps = [format_tool_use("apply_patch", {"input": add_files_patch(fix)})]
    else:
        steps = [format_tool_use("Read", {"file_path": "calc.py"}),
                 format_tool_use("Write", {"file_path": "calc.py", "content": fix["calc.py"]})]  # fmt: skip
    return Reply(text=steps[done] if done < len(steps) else "Done.")


def test_an_endpoint_model_runs_in_each_tasks_own_harness(tmp_path):
    from composer_replication.teacher_replay.fake_server import FakeOpenRouter

    tasks = write_tasks(tmp_path / "T", {"fix-sub": "codex", "fix-mul": "claude_code"})
    with FakeOpenRouter(script=_solver) as server:
        code = main(["eval", str(tasks), "--model", server.base_url, "--out", str(tmp_path / "o"),
                     "--sandbox", "bwrap"])  # fmt: skip
        assert code == 0 and server.n_requests == 2 + 3  # codex: patch, done; Claude Code: read, write, done
    (p,) = json.loads((tmp_path / "o" / "eval.json").read_text())["policies"]
    assert p["pass@1"] == 1.0 and p["checks_share"] == 1.0 and p["reward_hack_attempts"] == 0
    assert {r["task"]: r["harness"] for r in p["rows"]} == {"fix-sub": "codex", "fix-mul": "claude_code"}
    logs = {q.stem: q for q in (tmp_path / "o" / p["rollouts"]).glob("*.jsonl")}
    assert (
        json.loads(logs["fix-sub-000"].read_text().splitlines()[0])["type"] == "session_meta"
    )  # Codex's log
    # each log reads back through its source's ingester: the calls the model made, in their own tools
    tools = {
        name: [c["name"] for s in ing().ingest(logs[name]) for c in parse_tool_calls(s["student_action"])]
        for name, ing in (("fix-sub-000", CodexIngester), ("fix-mul-000", ClaudeCodeIngester))
    }
    assert tools == {"fix-sub-000": ["apply_patch"], "fix-mul-000": ["Read", "Write"]}, tools


def test_a_failing_endpoint_is_an_infrastructure_failure_not_a_score(task_dir, tmp_path):
    from composer_replication.teacher_replay.fake_server import FakeOpenRouter, Reply

    with FakeOpenRouter(script=lambda info: Reply(kind="http_error", status=401)) as server:
        code = main(
            ["eval", str(task_dir), "--model", server.base_url, "--out", str(tmp_path), "--sandbox", "bwrap"]
        )
    assert code == 0
    (p,) = json.loads((tmp_path / "eval.json").read_text())["policies"]
    assert p["pass@1"] is None and p["tasks_scored"] == 0 and p["infra_failures"] == 2
    assert all(r["infra_errors"][0].startswith("endpoint:") for r in p["rows"])


def test_compare_pairs_only_tasks_both_scored():
    a = {
        "name": "a",
        "rows": [
            {"task": "x", "scored": 1, "pass@1": 0.0, "checks_share": 0.5},
            {"task": "y", "scored": 0, "pass@1": None, "checks_share": None},
        ],
    }
    b = {"name": "b", "rows": [{"task": "x", "scored": 1, "pass@1": 1.0, "checks_share": 1.0},
                               {"task": "y", "scored": 1, "pass@1": 1.0, "checks_share": 1.0}]}  # fmt: skip
    c = compare(a, b)
    assert c["n_tasks"] == 1 and c["tasks_left_out"] == ["y"]
    assert c["pass@1"] == {
        "a": 0.0,
        "b": 1.0,
        "delta": 1.0,
        "delta_std": 0.0,
        "n": 1,
        "delta_ci95": [None, None],
    }


def test_usage_errors_are_one_line(task_dir, tmp_path, capsys):
    assert main(["eval", str(task_dir), "--out", str(tmp_path)]) == 1
    assert "give at least one --model or --policy" in capsys.readouterr().err
    assert main(["eval", str(task_dir), "--model", str(tmp_path / "nothing"), "--out", str(tmp_path)]) == 1
    assert "not `default`, `tiny`, a model or adapter directory" in capsys.readouterr().err
    assert main(["eval", str(task_dir), "--model", "tiny", "--model", "tiny", "--out", str(tmp_path)]) == 1
    assert "given twice" in capsys.readouterr().err
    assert main(["eval", str(task_dir), "--model", "tiny", "--max-turns", "0", "--out", str(tmp_path)]) == 1
    assert "--max-turns 0: must be at least 1" in capsys.readouterr().err
