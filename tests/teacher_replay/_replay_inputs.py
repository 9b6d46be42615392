"""Inputs for the replay tests (teacher_replay, replaysim, the replay CLI): trace states and teachers
priced on the loopback ``fake_openrouter`` server (the fixture is in tests/conftest.py)."""

from __future__ import annotations

from composer_replication.teacher_replay.fake_server import FakeOpenRouter

SECRET = "sk-or-v1-TEST-SECRET-0123456789abcdef"


def make_states(n: int, *, prefix: str = "s", student: str = '[TOOL_USE] name=Bash input={"command": "ls"}'):
    return [
        {
            "state_id": f"{prefix}{i}",
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"task {prefix}{i}: fix the failing test"},
            ],
            "student_action": student,
            "tools": ["Read", "Bash", "Edit"],
        }
        for i in range(n)
    ]


def make_teachers(srv: FakeOpenRouter, slugs=("t/a", "t/b", "t/c"), price=(1.0, 4.0)):
    for s in slugs:
        srv.prices[s] = price
    return [
        {"slug": s, "input_per_mtok": price[0], "output_per_mtok": price[1], "base_url": srv.base_url}
        for s in slugs
    ]
