"""Child process for the SIGKILL test: replay against BASE_URL with a cache, forever slow."""

import asyncio
import json
import sys

from composer_replication.teacher_replay.client import RetryPolicy, replay_states

base_url, cache, n_states = sys.argv[1], sys.argv[2], int(sys.argv[3])
states = [
    {"state_id": f"k{i}", "messages": [{"role": "user", "content": f"kill task {i}"}], "student_action": "x"}
    for i in range(n_states)
]
teachers = [
    {"slug": f"k/{t}", "input_per_mtok": 2.0, "output_per_mtok": 8.0, "base_url": base_url} for t in "ab"
]
rep = asyncio.run(
    replay_states(states, teachers, max_total_usd=1.0, cache_path=cache, concurrency=4, api_key="sk-kill-SECRET",
                  retry=RetryPolicy(backoff_base_s=0.001))
)  # fmt: skip
print(json.dumps({"errors": rep.n_errors, "cached": rep.n_cached}))
