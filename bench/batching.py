"""Dynamic batching on and off, side by side: small binary /solve requests from many keep-alive clients.

    python -m bench --suite batching [--quick]

For n = 8 and 32 and 1, 16, 64 and 256 clients, against one server with ``LU_MAX_BATCH=1``
(each request its own call) and one with the default (``LU_MAX_BATCH=64``, no delay), run in
turn in the same process: requests per second, p50/p99 latency, the mean number of requests
per device call (``lu_batch_size``) and the worker's busy time per request
(``lu_compute_seconds`` over requests answered).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from pathlib import Path

import httpx

from bench._report import save_text
from bench._timing import machine
from bench.service import _concurrency, start_server, table


def _scrape(url: str) -> dict[str, float]:
    wanted = ("lu_batch_size_sum", "lu_batch_size_count", "lu_compute_seconds_sum", "lu_worker_busy_seconds_total", "lu_worker_cpu_seconds_total")
    totals = dict.fromkeys(wanted, 0.0)
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def run(quick: bool, out: Path | None, progress: Callable[[str], None]) -> Path | None:
    sizes = [8] if quick else [8, 32]
    levels = [1, 8] if quick else [1, 16, 64, 256]
    seconds = 1.0 if quick else 4.0
    rows = []
    servers = {"off": start_server(LU_MAX_BATCH="1"), "on": start_server()}
    try:
        for n in sizes:
            for clients in levels:
                for mode, (_, url) in servers.items():
                    asyncio.run(_concurrency(url, 1, 0.2, n))  # compiled and connected before timing
                    before = _scrape(url)
                    row = asyncio.run(_concurrency(url, clients, seconds, n))
                    after = _scrape(url)
                    calls = after["lu_batch_size_count"] - before["lu_batch_size_count"]
                    served = after["lu_batch_size_sum"] - before["lu_batch_size_sum"]
                    busy = after["lu_compute_seconds_sum"] - before["lu_compute_seconds_sum"]
                    rows.append(
                        {
                            "n": n,
                            "clients": clients,
                            "batching": mode,
                            "req/s": round(row["req/s"]),
                            "p50 ms": round(row["p50 ms"], 2),
                            "p99 ms": round(row["p99 ms"], 2),
                            "requests per call": round(served / calls, 1) if calls else 0.0,
                            "worker µs per request": round(busy / served * 1e6, 1) if served else 0.0,
                            "non-200": row["non-200"],
                        }
                    )
                    progress(f"n={n} clients={clients} batching {mode}: {rows[-1]}")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    text = "\n".join(
        [
            f"# Dynamic batching, {datetime.date.today().isoformat()}",
            "",
            "Binary `/solve` of one n x n system with one right-hand side per request; keep-alive clients, each",
            "sending its next request when the last is answered; both servers run at once on the same machine",
            "(the client shares the cores).",
            "",
            table(rows, list(rows[0])),
            "",
            *[f"- {k}: {v}" for k, v in machine().items()],
            "",
        ]
    )
    return save_text(text, out, "batching-cpu", quick, progress)
