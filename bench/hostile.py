"""Hostile clients against a default-configured service: memory under concurrent large uploads, and the
latency of a small request while many slow clients hold connections.

    python -m bench --suite hostile [--quick]

* Peak RSS of the server process (VmHWM, reset before each level) while N clients upload a
  200 MB binary ``/lu_solve`` at once, for N = 1, 8, 32, 128, with the statuses they got
  (200, or 503 ``overloaded`` when the in-flight budget is full) and the budget's own peak.
* p50/p99 of a small JSON ``/solve`` with no other clients, and with 200 slow clients that
  sent headers and one byte of a body.
"""

from __future__ import annotations

import datetime
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from bench import service as service_bench
from bench._report import save_text
from bench._timing import machine

N_UPLOAD = 5000  # 5000 x 5000 float64 = 200 MB


def _rss_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def _reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def upload_body(n: int) -> tuple[bytes, dict[str, str]]:
    rng = np.random.default_rng(0)
    LU = rng.standard_normal((n, n)) + n * np.eye(n)  # a valid factorization: identity pivots
    pivots = np.arange(1, n + 1, dtype=np.int32)
    return service_bench.binary_body({"LU": LU, "pivots": pivots, "B": rng.standard_normal((n, 1))})


def uploads(url: str, pid: int, levels: list[int], n: int, progress: Callable[[str], None]) -> list[dict]:
    body, headers = upload_body(n)
    rows = []
    for clients in levels:
        time.sleep(1.0)
        base = _rss_kib(pid, "VmRSS")
        _reset_peak(pid)
        statuses: Counter[str] = Counter()
        lock = threading.Lock()

        def one(statuses: Counter[str] = statuses, lock: threading.Lock = lock) -> None:
            try:
                r = httpx.post(f"{url}/lu_solve", **service_bench.streamed(body, headers), timeout=600)
                status = str(r.status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            with lock:
                statuses[status] += 1

        start = time.perf_counter()
        threads = [threading.Thread(target=one) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        rows.append(
            {
                "clients": clients,
                "body MB": round(len(body) / 1e6),
                "statuses": ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())),
                "RSS before MiB": base >> 10,
                "peak RSS MiB": _rss_kib(pid, "VmHWM") >> 10,
                "peak - before MiB": (_rss_kib(pid, "VmHWM") - base) >> 10,
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        progress(f"{clients} uploads: {rows[-1]}")
    return rows


def slow_clients_latency(url: str, slow: int, requests: int, progress: Callable[[str], None]) -> list[dict]:
    small = {"A": [[3.0, 1.0], [1.0, 2.0]], "B": [9.0, 8.0]}
    rows = []
    with httpx.Client(timeout=60) as client:
        client.post(f"{url}/solve", json=small)
        for held in (0, slow):
            socks = []
            for _ in range(held):
                s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                s.sendall(b"POST /solve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
                s.sendall(b"Content-Length: 10000\r\n\r\n{")
                socks.append(s)
            times = []
            for _ in range(requests):
                t0 = time.perf_counter()
                assert client.post(f"{url}/solve", json=small).status_code == 200
                times.append(time.perf_counter() - t0)
            for s in socks:
                s.close()
            q = statistics.quantiles(times, n=100)
            p50, p99 = round(q[49] * 1e3, 2), round(q[98] * 1e3, 2)
            rows.append({"slow clients": held, "requests": requests, "p50 ms": p50, "p99 ms": p99})
            progress(f"small requests with {held} slow clients: {rows[-1]}")
    return rows


def run(quick: bool, out: Path | None, progress: Callable[[str], None]) -> Path | None:
    # Default settings (no limits raised): what a user who changed nothing gets.
    proc, url = service_bench.start_server(defaults=True)
    try:
        limit = _metric(url, "lu_inflight_limit_bytes")
        up = uploads(url, proc.pid, [1, 4] if quick else [1, 8, 32, 128], 1000 if quick else N_UPLOAD, progress)
        budget_peak = _metric(url, "lu_inflight_peak_bytes")
        lat = slow_clients_latency(url, 20 if quick else 200, 50 if quick else 300, progress)
    finally:
        service_bench.stop_servers([(proc, url)])
    facts = machine()
    text = "\n".join(
        [
            f"# Hostile clients, {datetime.date.today().isoformat()}",
            "",
            f"Default settings: LU_MAX_INFLIGHT_BYTES = {limit / 2**30:.2f} GiB (half the machine's memory); "
            f"the budget's own peak over the run: {budget_peak / 2**30:.2f} GiB.",
            "",
            "## Concurrent large uploads (binary /lu_solve)",
            "",
            service_bench.table(up, list(up[0])),
            "",
            "## A small request while slow clients hold connections",
            "",
            service_bench.table(lat, list(lat[0])),
            "",
            *[f"- {k}: {v}" for k, v in facts.items()],
            "",
        ]
    )
    return save_text(text, out, "hostile-cpu", quick, progress)
