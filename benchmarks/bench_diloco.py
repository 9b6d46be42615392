"""DiLoCo communication benchmark.

1. Bytes each replica sends per inner step: DDP (ring all-reduce of the gradient every step) against
   DiLoCo every H steps, over torchft (ring all-reduce of the pseudo-gradient) and over the object
   store (one upload per round; the bytes are the real serialised object). Expected ratio: 1/H.
2. Time of one object-store all-reduce of a 135M-parameter fp32 pseudo-gradient (SmolLM2-135M
   shapes) among 4 replicas, against the raw put + get of the same bytes on the same store (one
   put of this replica's object, a get of each of the 3 others' objects): the protocol's overhead
   (digest, validation, manifest, float64 fixed-order mean). Measured as the replica that arrives
   last (the other 3 have uploaded), which is the all-reduce's critical path.

The raw baseline is timed twice: one PUT then the GETs one after another (the baseline of the
target), and the same transfers all at once in a thread pool (what a raw client could reach by
overlapping them, as the all-reduce does). Each repetition's objects are deleted afterwards.

Run (uses ~8 GB; take the machine-wide lock):
    flock /work/coord/heavy.lock python3 benchmarks/bench_diloco.py [--params 135e6] [--stores local,moto,seaweedfs]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from composer_replication.diloco.serverless import digest
from composer_replication.diloco.serverless.allreduce import object_store_allreduce, round_prefix
from composer_replication.diloco.serverless.store import LocalDirStore, S3Store
from composer_replication.diloco.serverless.tensorfile import encode


def _serialize(tensors) -> bytes:
    return b"".join(encode(tensors))


def _metadata(data: bytes, rank: int) -> dict[str, str]:
    """The metadata a replica's own upload carries (its digest, rank, weight)."""
    return {digest.WRITE: digest.new(digest.WRITE, data).hexdigest(), "rank": str(rank), "weight": "1.0"}


def smollm2_shapes(target: float) -> dict[str, tuple[int, ...]]:
    """SmolLM2-135M parameter shapes (tied embeddings), layers trimmed/extended to ~target parameters."""
    shapes: dict[str, tuple[int, ...]] = {"embed": (49152, 576), "norm": (576,)}
    layer = {
        "q": (576, 576), "k": (192, 576), "v": (192, 576), "o": (576, 576),
        "gate": (1536, 576), "up": (1536, 576), "down": (576, 1536), "ln1": (576,), "ln2": (576,),
    }  # fmt: skip
    per_layer = sum(torch.Size(s).numel() for s in layer.values())
    n_layers = max(1, round((target - 49152 * 576) / per_layer))
    for i in range(n_layers):
        shapes.update({f"layers.{i}.{k}": s for k, s in layer.items()})
    return shapes


def contribution(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 1e-3 for k, s in shapes.items()}


def bytes_table(shapes: dict[str, tuple[int, ...]], k: int) -> str:
    """DDP and torchft DiLoCo: ring all-reduce, 2(k-1)/k x payload sent per replica per sync (analytic).
    Object store: the measured size of the serialised pseudo-gradient (one create-only PUT per round);
    a replica also downloads the k-1 other objects (the last column counts both directions)."""
    n = sum(torch.Size(s).numel() for s in shapes.values())
    payload = 4 * n
    blob = len(_serialize({name: torch.zeros(s) for name, s in shapes.items()}))  # real object size
    ring = 2 * (k - 1) / k * payload
    rows = [
        "| H | DDP sent/step | DiLoCo torchft sent/step | DiLoCo object store PUT/step | object store PUT+GET/step | ratio to DDP (sent) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for h in (1, 10, 100, 500):
        rows.append(
            f"| {h} | {ring / 1e6:,.1f} MB | {ring / h / 1e6:,.2f} MB | {blob / h / 1e6:,.2f} MB "
            f"| {k * blob / h / 1e6:,.2f} MB | {1 / h:.4f} |"
        )
    return (
        "\n".join(rows)
        + f"\n\n({n / 1e6:.1f}M fp32 parameters = {payload / 1e6:.1f} MB, object {blob / 1e6:.1f} MB, {k} replicas.)"
    )


CPU: dict[str, list[float]] = {"all-reduce": [], "raw": []}  # process CPU seconds per round (--cpu)


def _raw_round(store, run: str, mine_bytes: bytes, k: int, *, parallel: bool) -> float:
    """Seconds for a plain PUT of this replica's bytes and GETs of the k-1 others' (no checks)."""
    keys = [f"{round_prefix(run, 0)}/delta/{r:05d}.safetensors" for r in range(1, k)]
    t, cpu = time.perf_counter(), time.process_time()
    if parallel:  # the same transfers, all at once in a pool like the all-reduce's
        with ThreadPoolExecutor(max_workers=k) as pool:
            jobs = [pool.submit(store.put, f"raw-{run}/parallel", mine_bytes)]
            jobs += [pool.submit(store.get, key) for key in keys]
            for job in jobs:
                job.result()
    else:
        store.put(f"raw-{run}/mine", mine_bytes)
        for key in keys:
            store.get(key)
        CPU["raw"].append(time.process_time() - cpu)
    return time.perf_counter() - t


def _wipe(store, run: str) -> None:
    """Delete a repetition's objects (untimed): moto keeps every object in this process's memory."""
    if isinstance(store, LocalDirStore):
        for top in (run, f"raw-{run}"):
            shutil.rmtree(store.root / top, ignore_errors=True)
        return
    for top in (run, f"raw-{run}"):
        for key in store.list(top):
            store.client.delete_object(Bucket=store.bucket, Key=store._key(key))


def time_store(name: str, store, shapes, k: int, repeats: int) -> tuple[float, float, float]:
    """(all-reduce, raw put + gets, raw with the gets in parallel) seconds, medians over ``repeats``.

    The order of the all-reduce and the raw transfers alternates between repetitions."""
    others = {r: _serialize(contribution(shapes, r)) for r in range(1, k)}
    mine = contribution(shapes, 0)
    mine_bytes = _serialize(mine)
    ar, raw, par = [], [], []
    for rep in range(repeats):
        run = f"bench-{rep}-{time.time_ns()}"
        for r, data in others.items():  # the other replicas have already uploaded
            store.put_if_absent(
                f"{round_prefix(run, 0)}/delta/{r:05d}.safetensors", data, metadata=_metadata(data, r)
            )

        def allreduce(run: str = run) -> float:
            t, cpu = time.perf_counter(), time.process_time()
            res = object_store_allreduce(
                store, mine, run_id=run, round_index=0, rank=0, world_size=k, deadline_s=60
            )
            seconds = time.perf_counter() - t
            CPU["all-reduce"].append(time.process_time() - cpu)
            assert res.participants == list(range(k))
            return seconds

        if rep % 2 == 0:
            ar.append(allreduce())
            raw.append(_raw_round(store, run, mine_bytes, k, parallel=False))
        else:
            raw.append(_raw_round(store, run, mine_bytes, k, parallel=False))
            ar.append(allreduce())
        par.append(_raw_round(store, run, mine_bytes, k, parallel=True))
        _wipe(store, run)
        print(f"  {name} rep {rep}: all-reduce {ar[-1]:.2f}s, raw put+gets {raw[-1]:.2f}s, "
              f"parallel {par[-1]:.2f}s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)  # fmt: skip

    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    return median(ar), median(raw), median(par)


def start_seaweedfs(data_dir: str):
    weed = shutil.which("weed")
    if weed is None:
        return None, None
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testkey", "AWS_SECRET_ACCESS_KEY": "testsecret"}
    proc = subprocess.Popen([weed, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    import boto3

    client = boto3.client("s3", endpoint_url="http://127.0.0.1:8333", region_name="us-east-1",
                          aws_access_key_id="testkey", aws_secret_access_key="testsecret")  # fmt: skip
    end = time.time() + 60
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", 8333), timeout=0.5):
                client.list_buckets()
                client.create_bucket(Bucket="bench")
                return proc, S3Store("bench", client=client)
        except Exception:
            time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    return None, None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=135e6)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stores", default="local,moto,seaweedfs")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="also print this process's CPU seconds per round (local: all of it)",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    shapes = smollm2_shapes(args.params)
    n = sum(torch.Size(s).numel() for s in shapes.values())
    print("## Bytes sent per inner step\n")
    print(bytes_table(shapes, args.replicas))
    print(
        f"\n## Object-store all-reduce, {n / 1e6:.1f}M fp32 parameters ({4 * n / 1e6:.0f} MB), {args.replicas} replicas\n"
    )
    print(f"load average at start: {os.getloadavg()[0]:.1f}\n")
    print("| store | all-reduce (s) | raw put + 3 gets (s) | ratio | raw, in parallel (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    tmp = tempfile.mkdtemp(prefix="bench-diloco-")
    try:
        for name in filter(None, args.stores.split(",")):
            cleanup = None
            if name == "local":
                store = LocalDirStore(os.path.join(tmp, "local"))
            elif name == "moto":
                import logging

                from moto.server import ThreadedMotoServer

                logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise

                os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
                os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
                server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
                server.start()
                host, port = server.get_host_and_port()
                store = S3Store(
                    "bench", endpoint_url=f"http://{host}:{port}", region="us-east-1", create_bucket=True
                )
                cleanup = server.stop
            elif name == "seaweedfs":
                proc, store = start_seaweedfs(os.path.join(tmp, "weed"))
                if store is None:
                    print("| seaweedfs | not available | | | | |")
                    continue
                cleanup = lambda proc=proc: (os.killpg(proc.pid, signal.SIGKILL), proc.wait())  # noqa: E731
            else:
                raise SystemExit(f"unknown store {name!r}")
            try:
                ar, raw, par = time_store(name, store, shapes, args.replicas, args.repeats)
                print(
                    f"| {name} | {ar:.2f} | {raw:.2f} | {ar / raw:.2f}x | {par:.2f} | {ar / par:.2f}x |",
                    flush=True,
                )
                if args.cpu:
                    a, r = (sorted(CPU[k])[len(CPU[k]) // 2] for k in ("all-reduce", "raw"))
                    print(
                        f"  {name} CPU-s per round (median): all-reduce {a:.2f}, raw {r:.2f}, ratio {a / r:.2f}x"
                    )
                for v in CPU.values():
                    v.clear()
            finally:
                if cleanup:
                    cleanup()
                shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
