"""Builders for eval/GRPO tests: mined-style task folders (the Harbor layout `tasks mine` writes, through its
own writer) and a tiny model taught to answer a task's opening prompt with one fixed action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from composer_replication.tasks.layout import TaskDraft, publish, write_task

CHECK = "python3 -m pytest -q -p no:cacheprovider test_calc.py"
TASKS: dict[str, dict[str, Any]] = {
    "fix-sub": {
        "instruction": "Fix sub in calc.py: it adds instead of subtracting.",
        "files": {"calc.py": "def sub(a, b):\n    return a + b\n"},
        "tests": {"test_calc.py": "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"},
        "solution": {"calc.py": "def sub(a, b):\n    return a - b\n"},
    },
    "fix-mul": {
        "instruction": "Fix mul in calc.py: it returns the sum.",
        "files": {"calc.py": "def mul(a, b):\n    return a + b\n"},
        # test_two passes at the start too (2 + 2 == 2 * 2): half the check's tests pass without a fix
        "tests": {"test_calc.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
                  "\n\ndef test_two():\n    assert mul(2, 2) == 4\n"},
        "solution": {"calc.py": "def mul(a, b):\n    return a * b\n"},
    },
}  # fmt: skip


def write_tasks(root: Path, sources: dict[str, str | None] | None = None) -> Path:
    """``root`` holding the `TASKS` as mined task folders; ``sources`` gives a task's provenance harness."""
    root.mkdir(parents=True, exist_ok=True)
    for name, t in TASKS.items():
        source = (sources or {}).get(name)
        draft = TaskDraft(
            name=name, instruction=t["instruction"], files={**t["files"], **t["tests"]}, test_files=t["tests"],
            solution=t["solution"], deleted=[], checks=[CHECK], timeout_s=60.0,
            metadata={"source": source} if source else {"reference": "written by the test"},
            environment={"kind": "python", "packages": [], "install": []},
            verdict={"fail_to_pass": [CHECK], "pass_to_pass": []},
        )  # fmt: skip
        publish(write_task(root, draft), root / name)
    return root


def train_to_answer(
    model: Any, tok: Any, messages: list[dict[str, Any]], answer: str, steps: int = 100
) -> Any:
    """``model`` (a plain or PEFT model) trained with AdamW until it answers ``messages`` with ``answer``;
    the prompt is rendered the way the rollout's ``HFPolicy`` renders it."""
    import torch

    from composer_replication.datagen.rollout import HFPolicy

    prompt = HFPolicy(model, tok).engine.render(messages)
    reply = tok(answer + tok.eos_token, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt + reply])
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()
