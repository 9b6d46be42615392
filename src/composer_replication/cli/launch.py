"""Run DiLoCo replicas on local processes, Modal, HF Jobs, SageMaker or EKS, with live status.

  composer-replication launch --backend local --replicas 4 diloco.yaml
  composer-replication launch --backend eks --replicas 8 -o image=ghcr.io/me/cr:1 --gpu 1 diloco.yaml --dry-run

CONFIG is the replica config (YAML, TOML or JSON; see docs/diloco.md). Backend settings go in
``-o key=value`` (e.g. sagemaker: role_arn, image_uri, output_s3_uri; eks: image, namespace;
hf-jobs: namespace, image; modal: app_name). ``--dry-run`` prints the executor's ``describe()`` of
what would be launched (commands, the EKS Job manifest, the SageMaker requests, the HF Jobs specs)
and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from composer_replication.diloco.serverless.factory import BACKENDS

    parser.add_argument("config", help="replica config file (YAML, TOML or JSON)")
    parser.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="local",
        help="where the replicas run: local processes or a serverless backend (default local)",
    )
    parser.add_argument("--replicas", type=int, default=2, help="number of DiLoCo replicas (default 2)")
    parser.add_argument(
        "--gpu",
        default=None,
        help="backend GPU spec (modal 'H100', hf-jobs flavor, sagemaker instance type, eks count)",
    )
    parser.add_argument(
        "--timeout", type=int, default=3600, help="seconds each replica may run (default 3600)"
    )
    parser.add_argument(
        "--run-dir", default=None, help="local run directory (local backend; default runs/<run_id>)"
    )
    parser.add_argument(
        "-o",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="executor option, repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be launched and exit")
    parser.add_argument("--refresh", type=float, default=1.0, help="status refresh interval in seconds")


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--backend-option {pair!r} must look like KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def _load(path: str) -> dict[str, Any]:
    """The validated replica config as JSON-able data (errors name the file and the field)."""
    from composer_replication.config.replica import load_replica_config

    return load_replica_config(path).model_dump(mode="json")


def _progress(log_text: str) -> tuple[str, str]:
    """(step, last line) from a replica's log tail: the newest JSON record with a step, and the last line."""
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    step = "-"
    for ln in reversed(lines):
        if ln.startswith("{") and '"step"' in ln:
            try:
                step = str(json.loads(ln)["step"])
                break
            except (json.JSONDecodeError, KeyError):
                continue
    last = lines[-1] if lines else ""
    return step, last if len(last) <= 90 else last[:87] + "..."


def render_table(rows: list[tuple[int, str, str, str]]) -> str:
    head = f"{'rank':>4}  {'state':<10} {'step':>6}  last log line"
    return "\n".join([head, "-" * len(head)] + [f"{r:>4}  {s:<10} {st:>6}  {ln}" for r, s, st, ln in rows])


def watch(executor: Any, handles: list[Any], *, refresh: float = 1.0, out: Any = None) -> list[Any]:
    """Redraw a status table on ``out`` (default: the ``sys.stdout`` of the call, not of the import) until
    every replica has ended, then collect the results."""
    out = sys.stdout if out is None else out
    tty = out.isatty()
    shown = ""
    while True:
        rows = []
        for h in handles:
            state = executor.poll(h)
            rows.append((h.rank, state, *_progress(executor.stream_logs(h, n_lines=20))))
        table = render_table(rows)
        if table != shown:
            if tty and shown:
                out.write(f"\x1b[{shown.count(chr(10)) + 1}F\x1b[J")  # move up and clear the old table
            out.write(table + "\n")
            out.flush()
            shown = table
        if all(s in ("succeeded", "failed", "cancelled", "unknown") for _, s, _, _ in rows):
            return executor.collect(handles, timeout=60)
        time.sleep(refresh)


def run(args: argparse.Namespace) -> int:
    from composer_replication.diloco.serverless.executor import DEFAULT_ENTRYPOINT
    from composer_replication.diloco.serverless.factory import get_executor

    if args.replicas < 1:
        raise ValueError(f"--replicas {args.replicas}: need at least 1")
    config = _load(args.config)
    options = _options(args.backend_option)
    if args.backend == "local":
        run_dir = Path(args.run_dir or config.get("run_dir") or Path("runs") / config["run_id"])
        config["run_dir"] = str(run_dir)
        options.setdefault("run_dir", run_dir)
    elif args.backend == "sagemaker" and args.dry_run:
        options.setdefault("region", "us-east-1")
    try:
        executor = get_executor(args.backend, **options)
    except TypeError as exc:
        raise ValueError(f"backend {args.backend}: {exc}; pass it as -o KEY=VALUE") from None
    if args.dry_run:
        print(
            executor.describe(args.replicas, DEFAULT_ENTRYPOINT, config, gpu=args.gpu, timeout=args.timeout)
        )
        return 0
    handles = executor.launch_replicas(
        args.replicas, DEFAULT_ENTRYPOINT, config, gpu=args.gpu, timeout=args.timeout
    )
    print(f"launched {len(handles)} replicas on {args.backend}", flush=True)
    try:
        results = watch(executor, handles, refresh=args.refresh)
    except KeyboardInterrupt:
        for h in handles:
            executor.cancel(h)
        raise
    failed = [r for r in results if r.state != "succeeded"]
    digests = {(r.value or {}).get("param_sha256") for r in results if r.state == "succeeded"}
    print(
        f"{len(results) - len(failed)}/{len(results)} replicas succeeded; final parameter digests: {sorted(map(str, digests))}"
    )
    for r in failed:
        print(f"replica {r.rank} {r.state}:\n{r.error or ''}", file=sys.stderr)
    return 1 if failed else 0
