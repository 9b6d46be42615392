"""Teacher-replay throughput against the loopback OpenRouter-subset server.

N calls at a fixed server latency and a fixed concurrency: the ideal rate is concurrency / latency
(320 calls/s at 32 and 100 ms). Measured side by side in one invocation:
  - bare httpx: an asyncio.Semaphore + httpx.AsyncClient posting the same requests (no ledger, cache,
    retries, parsing) - the baseline for our own overhead;
  - replay_states: the full client (ledger reservations, JSONL cache appends, retries, parsing);
  - replay_states with fsync: the same, every ledger/cache record fsynced;
  - bare aiohttp: the same loop on aiohttp's client (its HTTP parser is C), a reference for what the
    loopback server and the machine allow.
The server runs in its own process so that it does not share the client's GIL.

    python3 benchmarks/bench_replay.py --calls 2000 --latency 0.1 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def states_for(n_states: int, tag: str) -> list[dict]:
    return [
        {
            "state_id": f"{tag}{i}",
            "messages": [
                {"role": "user", "content": f"{tag} task {i}: fix the failing test in tests/test_app.py"}
            ],
            "student_action": "[TOOL_USE] name=Bash input={}",
        }
        for i in range(n_states)
    ]


async def bare_httpx(base_url: str, states: list[dict], teachers: list[dict], concurrency: int) -> float:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def one(s: dict, t: dict) -> None:
            async with sem:
                r = await client.post(
                    f"{base_url}/chat/completions",
                    json={"model": t["slug"], "messages": s["messages"], "max_tokens": 64},
                )
                r.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s, t) for s in states for t in teachers))
        return time.perf_counter() - t0


async def bare_aiohttp(base_url: str, states: list[dict], teachers: list[dict], concurrency: int) -> float:
    import aiohttp

    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as client:

        async def one(s: dict, t: dict) -> None:
            async with sem:
                body = {"model": t["slug"], "messages": s["messages"], "max_tokens": 64}
                async with client.post(f"{base_url}/chat/completions", json=body) as r:
                    await r.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s, t) for s in states for t in teachers))
        return time.perf_counter() - t0


def run_replay(
    base_url: str, states: list[dict], teachers: list[dict], concurrency: int, fsync: bool
) -> float:
    from composer_replication.teacher_replay.client import replay_states

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        rep = asyncio.run(
            replay_states(
                states, teachers, max_total_usd=100.0, cache_path=Path(d) / "calls.jsonl",
                concurrency=concurrency, max_tokens=64, fsync=fsync, progress=False,
            )
        )  # fmt: skip
        dt = time.perf_counter() - t0
        assert rep.n_errors == 0, rep.errors_by_kind
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--latency", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--teachers", type=int, default=2)
    args = ap.parse_args()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "composer_replication.teacher_replay.fake_server",
            "--latency",
            str(args.latency),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = server.stdout.readline().strip()
        teachers = [
            {"slug": f"bench/t{i}", "input_per_mtok": 1.0, "output_per_mtok": 4.0, "base_url": base_url}
            for i in range(args.teachers)
        ]
        n_states = args.calls // args.teachers
        n = n_states * args.teachers
        ideal = args.concurrency / args.latency
        rows = []
        # warm up imports and connections
        asyncio.run(bare_httpx(base_url, states_for(2, "warm"), teachers, args.concurrency))
        dt = asyncio.run(bare_httpx(base_url, states_for(n_states, "bare"), teachers, args.concurrency))
        rows.append(("bare httpx (baseline)", dt))
        rows.append(
            (
                "replay_states",
                run_replay(base_url, states_for(n_states, "rs"), teachers, args.concurrency, False),
            )
        )
        rows.append(
            (
                "replay_states, fsync",
                run_replay(base_url, states_for(n_states, "fs"), teachers, args.concurrency, True),
            )
        )
        rows.append(
            (
                "bare aiohttp (reference)",
                asyncio.run(bare_aiohttp(base_url, states_for(n_states, "aio"), teachers, args.concurrency)),
            )
        )
        bare_rate = n / rows[0][1]
        print(
            f"{n} calls, latency {args.latency * 1000:.0f} ms, concurrency {args.concurrency}; ideal {ideal:.0f} calls/s"
        )
        print("| client | wall s | calls/s | vs ideal | vs bare httpx |")
        print("|---|---:|---:|---:|---:|")
        for name, dt in rows:
            rate = n / dt
            print(f"| {name} | {dt:.2f} | {rate:.1f} | {rate / ideal:.3f} | {rate / bare_rate:.3f} |")
        print(json.dumps({name: n / dt for name, dt in rows}))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
