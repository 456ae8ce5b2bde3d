"""Dynamic batching on and off, side by side: small binary /solve requests from many keep-alive clients.

    python -m bench --suite batching [--quick]
    python -m bench.batching --proof --out DIR   # the short grid `make gpu-proof` runs on a device

Servers with ``LU_MAX_BATCH=1`` (each request its own call), with the default
(``LU_MAX_BATCH=64``, ``LU_BATCH_DELAY_US=0``) and with batch delays of 100, 300 and
1000 us run at once; each case is measured against each server in turn, in the same
process, and the whole grid twice (rounds 1 and 2: the spread between them is the
noise of a shared machine). Per case: requests per second, p50/p99 latency, the mean
number of requests per device call (``lu_batch_size``) and the worker thread's busy
time per request answered: wall time from taking a job until waiting for the queue
again (``lu_worker_busy_seconds``; GIL waits included, waiting for a batch delay
excluded) and its CPU time (``lu_worker_cpu_seconds``), over ``lu_batch_size_sum``.

Goals (issue 15): on the CPU, at 64 clients and n = 8, the worker's time per request at least
5x lower with batching; on a GPU, at least 3x the requests per second. ``--proof`` runs the
grid a device's time allows (n = 8 and 32 at 64 and 256 clients, one round, no delay servers,
no in-process part) on whatever device the service picks (``LU_DEVICE``); the report is named
after that device (``batching-cpu-proof``, ``batching-gpu-h100-proof``, ...).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from bench._report import device_slug, save_text
from bench._timing import machine
from bench.service import _concurrency, start_server, stop_servers, table

_WANTED = ("lu_batch_size_sum", "lu_batch_size_count", "lu_worker_busy_seconds_total", "lu_worker_cpu_seconds_total")
DELAYS = (100, 300, 1000)


def _scrape(url: str) -> dict[str, float]:
    totals = dict.fromkeys(_WANTED, 0.0)
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def _process_cpu_s(pid: int) -> float:
    """A process's CPU time (user + system, every thread), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _case(server: tuple[subprocess.Popen, str], n: int, clients: int, seconds: float) -> dict:
    proc, url = server
    asyncio.run(_concurrency(url, 1, 0.2, n))  # compiled and connected before timing
    before, cpu = _scrape(url), _process_cpu_s(proc.pid)
    row = asyncio.run(_concurrency(url, clients, seconds, n))
    cpu, after = _process_cpu_s(proc.pid) - cpu, _scrape(url)
    d = {k: after[k] - before[k] for k in _WANTED}
    calls, served = d["lu_batch_size_count"], d["lu_batch_size_sum"]
    return {
        "req/s": round(row["req/s"]),
        "p50 ms": round(row["p50 ms"], 2),
        "p99 ms": round(row["p99 ms"], 2),
        "requests per call": round(served / calls, 1) if calls else 0.0,
        "worker busy µs/request": round(d["lu_worker_busy_seconds_total"] / served * 1e6, 1) if served else 0.0,
        "worker CPU µs/request": round(d["lu_worker_cpu_seconds_total"] / served * 1e6, 1) if served else 0.0,
        # The whole server (event loop, worker, every thread): batching must not just move the work.
        "server CPU µs/request": round(cpu / served * 1e6, 1) if served else 0.0,
        "non-200": row["non-200"],
    }


def _worker_alone(max_batch: int, clients: int, jobs: int) -> dict:
    """The device worker in-process, without HTTP: ``clients`` coroutines each submitting 8x8 solves in turn.

    What the worker costs per request with the event loop doing nothing else: the part of the
    HTTP figures that batching can change, without the client's and the protocol's noise.
    """
    from service.device import CpuDevice
    from service.metrics import Metrics
    from service.operations import OPERATIONS
    from service.worker import DeviceWorker

    metrics = Metrics("cpu", "bench")
    device = CpuDevice()
    device.attach_metrics(metrics)
    worker = DeviceWorker(device, metrics, max_queue=1024, retry_after_s=1, max_batch=max_batch)
    op = OPERATIONS["solve"]
    options = dict(op.options)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((8, 8)) + 8 * np.eye(8), rng.standard_normal((8, 1))

    def totals() -> dict[str, float]:
        return {k: metrics.registry.get_sample_value(k) or 0.0 for k in _WANTED}

    async def main() -> dict:
        for _ in range(100):  # compiled and warm
            await worker.submit("solve", op.compute, {"A": A, "B": B}, options)

        async def client() -> None:
            for _ in range(jobs // clients):
                await worker.submit("solve", op.compute, {"A": A, "B": B}, options)

        before, t0 = totals(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed, after = time.perf_counter() - t0, totals()
        d = {k: after[k] - before[k] for k in _WANTED}
        served = d["lu_batch_size_sum"]
        return {
            "requests/s": round(served / elapsed),
            "requests per call": round(served / d["lu_batch_size_count"], 1),
            "worker busy µs/request": round(d["lu_worker_busy_seconds_total"] / served * 1e6, 1),
            "worker CPU µs/request": round(d["lu_worker_cpu_seconds_total"] / served * 1e6, 1),
        }

    worker.start()
    try:
        return asyncio.run(main())
    finally:
        worker.stop(10)


def _goal(rows: list[dict], rounds: int) -> list[str]:
    """At 64 clients, n = 8: off/on ratios of busy time, req/s and p99, per round."""
    lines = [
        "| round | busy µs/request off → on | busy off/on | CPU off/on | server CPU µs/request off → on "
        "| req/s off → on | req/s on/off | p99 ms off → on |",
        "|---|---|---:|---:|---|---|---:|---|",
    ]
    for r in range(1, rounds + 1):
        cell = {
            x["batching"]: x for x in rows if x["round"] == r and x["n"] == 8 and x["clients"] == 64
        }  # fmt: skip
        off, on = cell.get("off"), cell.get("on")
        if not off or not on or not on["worker busy µs/request"] or not on["worker CPU µs/request"]:
            continue
        busy = off["worker busy µs/request"] / on["worker busy µs/request"]
        cpu = off["worker CPU µs/request"] / on["worker CPU µs/request"]
        lines.append(
            f"| {r} | {off['worker busy µs/request']} → {on['worker busy µs/request']} | {busy:.1f}× | {cpu:.1f}× "
            f"| {off['server CPU µs/request']} → {on['server CPU µs/request']} "
            f"| {off['req/s']} → {on['req/s']} | {on['req/s'] / max(off['req/s'], 1):.2f}× "
            f"| {off['p99 ms']} → {on['p99 ms']} |"
        )
    return lines


def _section(title: str, intro: list[str], rows: list[dict]) -> list[str]:
    """A report section with its table; nothing when the grid did not measure it."""
    if not rows:
        return []
    return [f"## {title}", "", *intro, *([""] if intro else []), table(rows, list(rows[0])), ""]


def _device_slug(url: str) -> str:
    """``cpu``, or ``gpu-`` and the model (``gpu-h100``): what the server computes on, for the report's name."""
    device = httpx.get(f"{url}/readyz").json()["device"]
    if device["kind"] == "cpu":
        return "cpu"
    return f"gpu-{device_slug(device.get('name'))}"


def run(quick: bool, out: Path | None, progress: Callable[[str], None], proof: bool = False) -> Path | None:
    sizes = [8] if quick else [8, 32]
    levels = [1, 8] if quick else [64, 256] if proof else [1, 16, 64, 256]
    delay_levels = [] if proof else [1, 8] if quick else [1, 64]
    seconds = 1.0 if quick else 2.0 if proof else 3.0
    rounds = 1 if quick or proof else 2
    rows: list[dict] = []
    delay_rows: list[dict] = []
    alone: list[dict] = []
    # LU_GPU_HOST_MAX_N=0: on a GPU these small systems would otherwise be solved on the host (the default
    # up to n = 32); this suite measures batching on the device. No effect on the CPU.
    on_device = {"LU_GPU_HOST_MAX_N": "0"}
    servers = {"off": start_server(LU_MAX_BATCH="1", **on_device), "on": start_server(**on_device)}
    delayed = {} if proof else {d: start_server(LU_BATCH_DELAY_US=str(d), **on_device) for d in DELAYS}
    try:
        device = _device_slug(servers["on"][1])
        for r in range(1, rounds + 1) if device == "cpu" and not proof else ():
            for clients in [1, 64]:
                for mode, max_batch in (("off", 1), ("on", 64)):
                    row = {"round": r, "clients": clients, "batching": mode}
                    alone.append(row | _worker_alone(max_batch, clients, 640 if quick else 6400))
                    progress(f"{alone[-1]}")
        for r in range(1, rounds + 1):
            for n in sizes:
                for clients in levels:
                    for mode, server in servers.items():
                        row = {"round": r, "n": n, "clients": clients, "batching": mode}
                        rows.append(row | _case(server, n, clients, seconds))
                        progress(f"{rows[-1]}")
            for clients in delay_levels:
                for delay, server in [(0, servers["on"]), *delayed.items()]:
                    row = {"round": r, "n": 8, "clients": clients, "LU_BATCH_DELAY_US": delay}
                    delay_rows.append(row | _case(server, 8, clients, seconds))
                    progress(f"{delay_rows[-1]}")
    finally:
        stop_servers([*servers.values(), *delayed.values()])
    alone_part = _section(
        "The worker alone (in-process, no HTTP)",
        [
            "`DeviceWorker` on the CPU with coroutines of one event loop submitting 8x8 solves in turn, nothing",
            "else running in the process: the worker's own cost per request, off (`LU_MAX_BATCH=1`) and on (64).",
        ],
        alone,
    )
    delay_part = _section("LU_BATCH_DELAY_US (n = 8; batching on)", [], delay_rows)
    text = "\n".join(
        [
            f"# Dynamic batching, {datetime.date.today().isoformat()} ({device}{', proof grid' if proof else ''})",
            "",
            "Binary `/solve` of one n x n float64 system with one right-hand side per request; keep-alive clients,",
            "each sending its next request when the last is answered (one asyncio client process, sharing the cores",
            "with the server). All servers run at once; each case is measured against each in turn, and the whole",
            f"grid {rounds} time(s) (column `round`): the spread between rounds is the noise of the machine.",
            "Worker busy time: wall time of the worker thread from taking a job until it waits for the queue again",
            "(GIL waits and preemption included, a batch delay's wait excluded), per request answered; worker CPU:",
            "the thread's CPU time, per request answered; server CPU: the whole server process's (event loop,",
            "worker and every other thread), per request answered.",
            "",
            "## Goal: 64 clients, n = 8",
            "",
            "On the CPU: worker time per request (busy off/on) at least 5×; on a GPU: req/s on/off at least 3×.",
            "",
            *_goal(rows, rounds),
            "",
            *alone_part,
            "## Batching off and on (LU_BATCH_DELAY_US=0, the default)",
            "",
            table(rows, list(rows[0])),
            "",
            *delay_part,
            *[f"- {k}: {v}" for k, v in machine().items()],
            "",
        ]
    )
    return save_text(text, out, f"batching-{device}{'-proof' if proof else ''}", quick, progress)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for the report (default: print only)")
    ap.add_argument("--quick", action="store_true", help="a tiny grid (a smoke test)")
    ap.add_argument("--proof", action="store_true", help="the short grid make gpu-proof runs on a device")
    args = ap.parse_args(argv)
    run(args.quick, args.out, lambda msg: print(msg, flush=True), proof=args.proof)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
