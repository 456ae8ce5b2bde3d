"""Service benchmark: transport cost of JSON vs binary, and small-request throughput.

Starts ``python -m service`` on loopback (as a user would) and measures, in one run:

* receiving one 128 MiB binary request (read in full, decoded, refused before compute)
  against a plain loopback TCP copy of the same bytes, rep by rep: the receive cost in
  plain copies (goal <= 1.2); beside it the same service without the receive-buffer pool.
* ``lu_solve`` round trips at n = 256, 1024, 2048, 4096 (float64, one right-hand
  side; the request carries the n x n factorization) in JSON and in the binary
  framing, against the in-process ``lu_core.lu_solve`` call and against a plain
  loopback TCP copy of the same request and response bytes. "Overhead" is
  (round trip - in-process call) / plain copy: the target for binary is <= 1.5.
* 8x8 ``/solve`` requests (binary) at 1, 16 and 64 concurrent clients: requests
  per second and p50/p99 latency; and at 16 clients against a bare ASGI app under the
  same uvicorn configuration and protocol class (``bench/_bare_asgi.py``), rounds
  alternating in one run (goal: the service >= 60% of the bare app's rate).
* Stored factorizations at n = 2048 and 4096 (float64): 10 one-right-hand-side
  solves that resend the LU each time (``/lu_solve``) against 10 solves of a
  factorization stored once (``PUT /factorizations/{name}``, then
  ``/factorizations/{name}/solve`` with only B); the goal is >= 10x at n = 4096.
* gRPC against HTTP binary, in the same run: 8x8 ``solve`` at 16 concurrent
  clients (``grpc.aio`` calls on one channel against 16 keep-alive HTTP/1.1
  connections to ``/v2/models/solve/infer``), and one 256 MiB ``lu_unpack``
  (request; the answer is three times that) through each, or less where the server's
  gRPC port takes no message that large (``grpc_payload_bytes``).

Client and server share the machine's cores, so on a small VM the client's own
work is part of every number. Run: ``python -m bench.service [--quick] [--out DIR] [--only PART ...]``
(parts: transport, concurrency, stored, grpc).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

import lu_core
from bench._timing import machine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


# --------------------------------------------------------------------------- wire helpers


def binary_body(tensors: dict[str, np.ndarray], parameters: dict | None = None) -> tuple[bytes, dict[str, str]]:
    names = {np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32"}
    inputs = [
        {"name": k, "shape": list(v.shape), "datatype": names[v.dtype], "parameters": {"binary_data_size": v.nbytes}}
        for k, v in tensors.items()
    ]
    header = orjson.dumps({"inputs": inputs, "parameters": parameters or {}})
    body = b"".join([header, *(np.ascontiguousarray(v).tobytes() for v in tensors.values())])
    return body, {"content-type": "application/octet-stream", "inference-header-content-length": str(len(header))}


def streamed(body: bytes, headers: dict[str, str], size: int = 1 << 20) -> dict[str, Any]:
    """httpx keyword arguments that send ``body`` in ``size``-byte views, with its Content-Length (else
    httpx would send it chunked, and the service reads a chunked body through another path). Given
    one ``bytes``, httpx's sync client re-slices (copies) what is left after every partial send,
    quadratic in the size: 4.7 s for 256 MiB on loopback, 0.07 s in 1 MiB views (lu_client sends its
    bodies the same way)."""
    view = memoryview(body).cast("B")  # bytes, whatever the buffer's item size
    chunks = (view[i : i + size] for i in range(0, view.nbytes, size))
    return {"content": chunks, "headers": {**headers, "content-length": str(view.nbytes)}}


def json_body(tensors: dict[str, np.ndarray]) -> bytes:
    return orjson.dumps({k: np.ascontiguousarray(v) for k, v in tensors.items()}, option=orjson.OPT_SERIALIZE_NUMPY)


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(port: int, defaults: bool, settings: dict[str, str]) -> dict[str, str]:
    """The environment of a server started by :func:`start_server`: this process's, ``LU_DEVICE`` as
    asked here (else ``auto``), then ``settings`` over everything (``LU_DEVICE="cpu"`` wins)."""
    # gRPC stays off unless asked for (LU_GRPC_PORT), so that suites never contend for port 8001.
    env = {**os.environ, "LU_PORT": str(port), "LU_DEVICE": os.environ.get("LU_DEVICE", "auto")}
    env |= {"LU_GRPC_PORT": "0", **settings}
    env |= {"LU_LOG_LEVEL": "warning"}
    if not defaults:
        env |= {"LU_MAX_REQUEST_BYTES": str(2 << 30), "LU_MAX_ELEMENTS": str(1 << 28)}
        env |= {"LU_MAX_JSON_BYTES": str(2 << 30), "LU_STORE_BYTES": str(1 << 30)}
    return env


def stop_servers(started: list[tuple[subprocess.Popen, str]]) -> None:
    """Terminate every server, then wait for each; one that outlives its grace period is killed."""
    for proc, _ in started:
        proc.terminate()
    for proc, _ in started:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_server(defaults: bool = False, module: str = "service", **settings: str) -> tuple[subprocess.Popen, str]:
    """The service as its own process; ``defaults``: no limit raised (else room for the biggest cases).

    ``module="bench._bare_asgi"`` starts the bare-ASGI baseline under the same server settings.
    """
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=server_env(port, defaults, settings))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass  # the port is not open yet
        time.sleep(0.2)  # also while /readyz says 503 (warming up): polling must not slow the warm-up
    proc.kill()
    raise SystemExit("the service did not become ready")


class CopyServer:
    """Plain loopback TCP: reads a request of known size, answers a response of known size."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.sizes: tuple[int, int] = (0, 0)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            with conn:
                while True:
                    need, answer = self.sizes
                    got = 0
                    buf = bytearray(1 << 20)
                    while got < need:
                        n = conn.recv_into(buf)
                        if n == 0:
                            break
                        got += n
                    if got < need:
                        break
                    conn.sendall(self.reply[:answer])

    def round_trip(self, payload: bytes, answer: int) -> Callable[[], None]:
        self.sizes = (len(payload), answer)
        self.reply = bytes(answer)
        client = socket.create_connection(("127.0.0.1", self.port))
        buf = bytearray(1 << 20)

        def once() -> None:
            client.sendall(payload)
            got = 0
            while got < answer:
                got += client.recv_into(buf)

        return once


def _content_length(lines: list[str]) -> int:
    return next(int(v) for k, _, v in (ln.partition(": ") for ln in lines[1:]) if k.lower() == "content-length")


class RawHttp:
    """A minimal HTTP/1.1 keep-alive client over a plain socket.

    Used for the transport numbers so that they measure the service, not the client
    library: httpx's sync client re-slices a bytes body on every partial send, which
    costs ~5x a plain copy at 100 MB (lu_client streams bodies in chunks for that reason).
    """

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.sock = self._connect()
        self.buf = bytearray(1 << 20)
        self._connect()

    def _connect(self) -> None:
        self.sock = socket.create_connection(self.address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        return self.request("POST", path, body, headers)

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        try:
            return self._request(method, path, body, headers)
        except ConnectionError:
            # uvicorn closes a keep-alive connection idle for 5 s (preparing the next case can take
            # that long on a loaded machine): reconnect once; every request here is safe to resend.
            self.sock.close()
            self.sock = self._connect()
            return self._request(method, path, body, headers)

    def _request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.sock.sendall(head.encode())
        self.sock.sendall(body)
        data = bytearray()
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("the server closed the connection")
            data += chunk
        header, _, rest = bytes(data).partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            (int(v) for k, _, v in (line.partition(": ") for line in lines[1:]) if k.lower() == "content-length"),
            0,  # a 204 has no body and no Content-Length
        )
        out = bytearray(length)
        out[: len(rest)] = rest
        got = len(rest)
        view = memoryview(out)
        while got < length:
            got += self.sock.recv_into(view[got:])
        return status, bytes(out)


def median_time(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (max(times) - min(times))


# --------------------------------------------------------------------------- cases


def _transport_case(client: RawHttp, copier: CopyServer, n: int, progress: Callable[[str], None]) -> dict:
    rng = np.random.default_rng(n)
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    LU, piv = lu_core.lu_factor(A)
    LU = np.ascontiguousarray(LU)  # row-major, as the wire carries it and the server receives it
    B = rng.standard_normal((n, 1))
    tensors = {"LU": LU, "pivots": piv, "B": B}
    reps = 7 if n <= 1024 else 5
    inproc, _ = median_time(lambda: lu_core.lu_solve(LU, piv, B, check_errors=True), reps)
    bbody, bheaders = binary_body(tensors)

    def post_binary() -> None:
        status, _ = client.post("/lu_solve", bbody, bheaders)
        assert status == 200, status

    _, content = client.post("/lu_solve", bbody, bheaders)
    out_bytes = len(content)
    X = np.frombuffer(content[-B.nbytes :], np.float64).reshape(B.shape)
    np.testing.assert_allclose(X, lu_core.lu_solve(LU, piv, B))
    copy, _ = median_time(copier.round_trip(bbody, out_bytes), reps)
    binary, _ = median_time(post_binary, reps)
    progress(f"n={n}: binary {binary * 1e3:.1f} ms (copy {copy * 1e3:.1f}, in-process {inproc * 1e3:.1f})")
    jbody = json_body(tensors)

    def post_json() -> None:
        status, content = client.post("/lu_solve", jbody, {"content-type": "application/json"})
        assert status == 200, status
        orjson.loads(content)

    jtime, _ = median_time(post_json, 1 if n >= 2048 else reps)
    progress(f"n={n}: json {jtime * 1e3:.1f} ms")
    return {
        "n": n,
        "in-process ms": inproc * 1e3,
        "bytes": len(bbody) + out_bytes,
        "copy ms": copy * 1e3,
        "binary ms": binary * 1e3,
        "binary MB/s": (len(bbody) + out_bytes) / binary / 1e6,
        "binary overhead / copy": (binary - inproc) / copy,
        "json bytes": len(jbody),
        "json ms": jtime * 1e3,
        "json MB/s": len(jbody) / jtime / 1e6,
        "json / binary": jtime / binary,
    }


def transport(url: str, sizes: list[int], copier: CopyServer, progress: Callable[[str], None]) -> list[dict]:
    client = RawHttp(url)
    try:
        return [_transport_case(client, copier, n, progress) for n in sizes]
    finally:
        client.sock.close()


def _small_solve(n: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"A": rng.standard_normal((n, n)) + n * np.eye(n), "B": rng.standard_normal((n, 1))}


async def _concurrency(url: str, clients: int, seconds: float, n: int = 8, path: str = "/solve") -> dict:
    """``clients`` keep-alive connections, each sending its next n x n solve (to ``path``) when the last is answered."""
    body, headers = binary_body(_small_solve(n))
    head = f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n"
    request = (head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode() + body
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            writer.write(request)
            header = await reader.readuntil(b"\r\n\r\n")
            lines = header.decode("latin-1").split("\r\n")
            length = next(
                int(v) for k, _, v in (ln.partition(": ") for ln in lines[1:]) if k.lower() == "content-length"
            )
            await reader.readexactly(length)
            if not lines[0].startswith("HTTP/1.1 200"):
                errors += 1
            latencies.append(time.perf_counter() - t0)
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    lat = np.array(latencies) * 1e3
    return {
        "clients": clients,
        "requests": len(latencies),
        "req/s": len(latencies) / elapsed,
        "p50 ms": float(np.percentile(lat, 50)),
        "p99 ms": float(np.percentile(lat, 99)),
        "non-200": errors,
    }


def concurrency(url: str, levels: list[int], seconds: float, progress: Callable[[str], None]) -> list[dict]:
    rows = []
    for c in levels:
        row = asyncio.run(_concurrency(url, c, seconds))
        progress(f"{c} clients: {row['req/s']:.0f} req/s, p50 {row['p50 ms']:.2f} ms, p99 {row['p99 ms']:.2f} ms")
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- receiving a big body

RECEIVE_N = 4096  # LU of 4096 x 4096 float64: a 128 MiB body


def _receive_body() -> tuple[bytes, dict[str, str]]:
    """A 128 MiB ``/lu_solve`` body whose B has one row too few: read, decoded, then refused (422) before compute."""
    n = RECEIVE_N
    LU = np.random.default_rng(7).standard_normal((n, n))
    return binary_body({"LU": LU, "pivots": np.arange(1, n + 1, dtype=np.int32), "B": np.ones((n - 1, 1))})


def receive_cost(urls: dict[str, str], copier: CopyServer, reps: int, progress: Callable[[str], None]) -> list[dict]:
    """Each contender's time for the 128 MiB request, interleaved rep by rep with the plain copy."""
    body, headers = _receive_body()
    clients = {name: RawHttp(url) for name, url in urls.items()}
    answer = 0
    for client in clients.values():
        status, content = client.post("/lu_solve", body, headers)
        assert status == 422, (status, content[:200])
        answer = len(content)
    contenders: dict[str, Callable[[], object]] = {"plain loopback copy": copier.round_trip(body, answer)}
    for name, client in clients.items():
        contenders[name] = lambda c=client: c.post("/lu_solve", body, headers)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()  # warm: the pool holds a buffer, the copy server's socket is open
    for _ in range(reps):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    for client in clients.values():
        client.sock.close()
    copy = statistics.median(times["plain loopback copy"])
    best_copy = min(times["plain loopback copy"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"receiver": name, "bytes": len(body), "median ms": med * 1e3, "best ms": min(ts) * 1e3,
                     "median / copy": med / copy, "best / best copy": min(ts) / best_copy})  # fmt: skip
        progress(f"receive 128 MiB, {name}: {med * 1e3:.1f} ms (median), {med / copy:.2f}x the plain copy")
    return rows


BARE = "bare ASGI app"
BARE_COLUMNS = ["server", "clients", "rounds", "req/s", "/ bare", "/ inline", "p50 ms", "p99 ms", "non-200"]
INLINE = "bare app computing inline"
#: The same service computing on the CPU, beside a GPU service: issue 20's goal is the GPU service's
#: 8x8 rate at 16 clients at least this one's, on the same host in the same run.
ON_CPU = "service, LU_DEVICE=cpu"


def small_vs_bare(urls: dict[str, str], clients: int, seconds: float, rounds: int, progress) -> list[dict]:
    """8x8 ``/solve`` at ``clients`` connections against each of ``urls`` (the service, the bare ASGI app
    under ``BARE``, ...), alternating round by round."""
    runs: dict[str, list[dict]] = {name: [] for name in urls}
    for target in urls.values():  # warm: first calls load lu_core's compiled kernels
        asyncio.run(_concurrency(target, 2, 0.3))
    for _ in range(rounds):
        for name, target in urls.items():
            runs[name].append(asyncio.run(_concurrency(target, clients, seconds)))
    bare_rate = statistics.median(r["req/s"] for r in runs[BARE])
    inline_rate = statistics.median(r["req/s"] for r in runs[INLINE]) if INLINE in runs else None
    rows = []
    for name, rs in runs.items():
        rate = statistics.median(r["req/s"] for r in rs)
        rows.append({"server": name, "clients": clients, "rounds": len(rs), "req/s": rate,
                     "p50 ms": statistics.median(r["p50 ms"] for r in rs),
                     "p99 ms": statistics.median(r["p99 ms"] for r in rs),
                     "non-200": sum(r["non-200"] for r in rs), "/ bare": rate / bare_rate,
                     "/ inline": rate / inline_rate if inline_rate else None})  # fmt: skip
        progress(f"8x8 solve, {clients} clients, {name}: {rate:.0f} req/s ({rate / bare_rate:.0%} of bare)")
    return rows


SOLVES = 10  # one-right-hand-side solves per system in the stored-factorization case


def _stored_case(client: RawHttp, n: int, progress: Callable[[str], None]) -> dict:
    rng = np.random.default_rng(n + 1)
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    LU, piv = lu_core.lu_factor(A)
    LU = np.ascontiguousarray(LU)  # what a client holding the factorization sends
    Bs = [rng.standard_normal((n, 1)) for _ in range(SOLVES)]
    resend_bodies = [binary_body({"LU": LU, "pivots": piv, "B": B}) for B in Bs]
    stored_bodies = [binary_body({"B": B}) for B in Bs]
    factor_body = binary_body({"A": A})
    name = f"bench-{n}"

    def resend() -> list[bytes]:
        out = []
        for body, headers in resend_bodies:
            status, content = client.post("/lu_solve", body, headers)
            assert status == 200, status
            out.append(content)
        return out

    def stored() -> list[bytes]:
        out = []
        for body, headers in stored_bodies:
            status, content = client.post(f"/factorizations/{name}/solve", body, headers)
            assert status == 200, status
            out.append(content)
        return out

    def put() -> None:
        status, _ = client.request("PUT", f"/factorizations/{name}", *factor_body)
        assert status in (200, 201), status

    reps = 3
    put_time, _ = median_time(put, reps)
    # the same answers both ways, bit for bit
    assert [c[-n * 8 :] for c in resend()] == [c[-n * 8 :] for c in stored()]
    resend_time, _ = median_time(resend, reps)
    stored_time, _ = median_time(stored, reps)
    progress(
        f"n={n}: {SOLVES} solves resending LU {resend_time * 1e3:.0f} ms, stored {stored_time * 1e3:.1f} ms "
        f"({resend_time / stored_time:.1f}x); PUT {put_time * 1e3:.0f} ms"
    )
    status, _ = client.request("DELETE", f"/factorizations/{name}", b"", {})
    assert status == 204, status
    return {
        "n": n,
        "solves": SOLVES,
        "resend ms": resend_time * 1e3,
        "stored ms": stored_time * 1e3,
        "resend / stored": resend_time / stored_time,
        "PUT ms": put_time * 1e3,
        "bytes per resend": len(resend_bodies[0][0]),
        "bytes per stored": len(stored_bodies[0][0]),
    }


def stored_factorizations(url: str, sizes: list[int], progress: Callable[[str], None]) -> list[dict]:
    client = RawHttp(url)
    try:
        return [_stored_case(client, n, progress) for n in sizes]
    finally:
        client.sock.close()


# --------------------------------------------------------------------------- gRPC against HTTP binary


def _grpc_request(model: str, tensors: dict[str, np.ndarray]):  # -> service_pb2.ModelInferRequest
    from tritonclient.grpc import service_pb2 as pb

    names = {np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32"}
    request = pb.ModelInferRequest(model_name=model)
    for name, arr in tensors.items():
        request.inputs.add(name=name, datatype=names[arr.dtype], shape=list(arr.shape))
        request.raw_input_contents.append(np.ascontiguousarray(arr).tobytes())
    return request


def _grpc_channel(target: str):
    import grpc

    return grpc.aio.insecure_channel(
        target, options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )


async def _grpc_concurrency(target: str, clients: int, seconds: float) -> dict:
    """``clients`` coroutines on one HTTP/2 channel, each sending its next call when the last is answered."""
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    request = _grpc_request("solve", _small_solve())
    latencies: list[float] = []
    async with _grpc_channel(target) as channel:
        infer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer
        await infer(request)
        stop = time.perf_counter() + seconds

        async def one_client() -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await infer(request)
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    lat = np.array(latencies) * 1e3
    return {
        "clients": clients,
        "requests": len(latencies),
        "req/s": len(latencies) / elapsed,
        "p50 ms": float(np.percentile(lat, 50)),
        "p99 ms": float(np.percentile(lat, 99)),
    }


#: The big gRPC case's matrices: n, and the bytes of one with its pivots.
GRPC_N = 64
GRPC_MATRIX_BYTES = 8 * GRPC_N * GRPC_N + 4 * GRPC_N


def grpc_payload_bytes(wanted: int, env: dict[str, str]) -> int:
    """The big gRPC case's tensor bytes: ``wanted``, or less where the server started with ``env`` takes no
    message that large (its largest, ``service.grpc_server.max_message_bytes``, follows ``LU_MAX_INFLIGHT_BYTES``,
    which defaults to a share of the machine's memory: about 126 MiB on a 24 GiB machine), with 1/16 to spare
    for the message's framing."""
    from service.grpc_server import max_message_bytes

    largest = max_message_bytes(server_settings(env))
    nbytes = min(wanted, largest - largest // 16)
    if nbytes < GRPC_MATRIX_BYTES:
        raise ValueError(
            f"the server's gRPC port takes messages of at most {largest} bytes: too few for one {GRPC_N}x{GRPC_N} "
            "float64 matrix; raise LU_MAX_INFLIGHT_BYTES (or LU_MAX_REQUEST_BYTES) or leave out the grpc part"
        )
    return nbytes


def server_settings(env: dict[str, str]) -> Any:
    """The ``service.config.Settings`` of a server started with ``env`` (its ``LU_`` variables)."""
    from service.config import Settings

    return Settings(**{k[3:].lower(): v for k, v in env.items() if k.startswith("LU_")})


def grpc_vs_http(url: str, target: str, nbytes: int, seconds: float, progress: Callable[[str], None]) -> list[dict]:
    """The small-request rate at 16 clients and one big ``lu_unpack``, over gRPC and over HTTP binary."""
    rows = []
    for name, measure in (
        ("HTTP binary", lambda: _concurrency(url, 16, seconds, path="/v2/models/solve/infer")),
        ("gRPC", lambda: _grpc_concurrency(target, 16, seconds)),
    ):
        row = asyncio.run(measure())
        progress(f"8x8 solve, 16 clients, {name}: {row['req/s']:.0f} req/s, p50 {row['p50 ms']:.2f} ms")
        rows.append({"case": "8x8 solve, 16 clients", "protocol": name, **row})

    n = GRPC_N
    batch = nbytes // GRPC_MATRIX_BYTES  # LU and its pivots within nbytes
    LU = np.random.default_rng(2).standard_normal((batch, n, n))
    piv = np.broadcast_to(np.arange(1, n + 1, dtype=np.int32), LU.shape[:-1]).copy()
    expected_out = 3 * LU.nbytes
    body, headers = binary_body({"LU": LU, "pivots": piv})
    client = RawHttp(url)

    def over_http() -> None:
        status, content = client.post("/v2/models/lu_unpack/infer", body, headers)
        assert status == 200, status
        assert len(content) > expected_out, len(content)

    request = _grpc_request("lu_unpack", {"LU": LU, "pivots": piv})

    async def over_grpc(reps: int) -> list[float]:
        from tritonclient.grpc import service_pb2_grpc as pb_grpc

        times = []
        async with _grpc_channel(target) as channel:
            infer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer
            for _ in range(reps + 1):
                t0 = time.perf_counter()
                response = await infer(request)
                times.append(time.perf_counter() - t0)
                assert sum(len(r) for r in response.raw_output_contents) == expected_out
                del response
        return times[1:]  # the first call warms up

    reps = 3
    try:
        http_s, _ = median_time(over_http, reps)
    finally:
        client.sock.close()
    grpc_s = statistics.median(asyncio.run(over_grpc(reps)))
    moved = len(body) + expected_out
    for name, secs in (("HTTP binary", http_s), ("gRPC", grpc_s)):
        progress(f"lu_unpack of {LU.nbytes >> 20} MiB, {name}: {secs * 1e3:.0f} ms")
        rows.append({"case": f"lu_unpack, {LU.nbytes >> 20} MiB in, {expected_out >> 20} MiB out",
                     "protocol": name, "ms": secs * 1e3, "MB/s": moved / secs / 1e6})  # fmt: skip
    return rows


# --------------------------------------------------------------------------- report


def table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if v < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report(
    transport_rows: list[dict],
    conc_rows: list[dict],
    stored_rows: list[dict],
    grpc_rows: list[dict],
    device: str,
    receive_rows: list[dict] | None = None,
    bare_rows: list[dict] | None = None,
) -> str:
    """The markdown report; parts that did not run (``--only``) are left out."""
    facts = machine()
    facts["service device"] = device
    lines = [
        f"# Service benchmark ({datetime.date.today().isoformat()}, {device})",
        "",
        "Command: `python -m bench.service`. Server: `python -m service` on loopback, one device worker.",
        "Client: a minimal keep-alive HTTP/1.1 client on plain sockets in the same machine (it shares the",
        "cores with the server), so that the numbers are the service's, not a client library's.",
        "",
    ]
    if receive_rows:
        lines += [
            f"## Receiving a {receive_rows[0]['bytes'] >> 20} MiB binary request",
            "",
            f"The request: `/lu_solve` with a {RECEIVE_N} x {RECEIVE_N} float64 LU (128 MiB), its pivots and a B with",
            "one row too few, in the binary framing. The service reads the whole body, decodes it and answers 422",
            "`invalid_shape` before anything is computed, so its time is receiving (and decoding: views, no copy).",
            "`plain loopback copy` = the same body bytes sent over a loopback TCP connection to a thread that",
            "`recv_into`s a reused 1 MiB buffer until it has them all and answers as many bytes as the 422 has;",
            "each time runs from the client's first byte sent to the last answer byte received, on a kept-alive",
            "connection, with the same client socket code. The contenders alternate rep by rep in one run;",
            "`median / copy` is the receive cost in plain copies (goal: <= 1.2 for the service). Rows other",
            "than `service` are the same service with one change, to show what each part of the transport buys.",
            "",
            table(receive_rows, ["receiver", "median ms", "best ms", "median / copy", "best / best copy"]),
            "",
        ]
    if transport_rows:
        lines += [
            "## lu_solve round trip, float64, one right-hand side",
            "",
            "`bytes` = request + response bytes of the binary framing. `in-process` = `lu_core.lu_solve` on the",
            "row-major arrays the server decodes (it includes the transpose to LAPACK's column-major layout).",
            "`copy` = the same bytes through a plain loopback TCP socket (send request, receive response).",
            "`binary overhead / copy` = (binary round trip - in-process) / copy; the target is <= 1.5.",
            "",
            table(
                transport_rows,
                ["n", "bytes", "in-process ms", "copy ms", "binary ms", "binary MB/s", "binary overhead / copy"],
            ),
            "",
            table(transport_rows, ["n", "json bytes", "json ms", "json MB/s", "json / binary"]),
            "",
        ]
    if conc_rows:
        lines += [
            "## 8x8 /solve requests (binary), concurrent clients",
            "",
            table(conc_rows, ["clients", "requests", "req/s", "p50 ms", "p99 ms", "non-200"]),
            "",
        ]
    if bare_rows:
        lines += [
            "## The service against a bare ASGI app under the same server (8x8 /solve, binary)",
            "",
            "`bare ASGI app` (`bench/_bare_asgi.py`): the same uvicorn configuration and protocol class as",
            "`python -m service` (`service.__main__.server_config`), serving an app that reads the body and",
            "answers a fixed body of the size of the service's answer. Same client (keep-alive connections on",
            "asyncio streams), same run, alternating rounds; medians over rounds. Goal: service >= 60% of bare.",
            f"`{INLINE}` (`LU_BARE_COMPUTE=1`): the same app doing a request's own work inline on the event",
            "loop (the service's binary decoding, `lu_core.solve`, the binary encoding of X) and nothing else:",
            "no admission, request ids, metrics, worker thread or buffer pool: what a request's own work, in",
            "Python on the event loop, leaves of the bare app's rate on this machine; `service / inline` is what",
            "the service's own layers leave of that. (It computes on the CPU, whatever the service's device.)",
            *(
                [
                    f"`{ON_CPU}`: the same service on the CPU of the same host (a GPU service's goal: at least",
                    "its req/s). Both compute an 8x8 system on the host CPU unless `LU_GPU_HOST_MAX_N=0`",
                    "(default 32): the comparison is of the two services' paths, not of GPU against CPU compute.",
                ]
                if any(r["server"] == ON_CPU for r in bare_rows)
                else []
            ),
            "",
            table(bare_rows, BARE_COLUMNS),
            "",
        ]
    if stored_rows:
        stored_columns = ["n", "solves", "resend ms", "stored ms", "resend / stored", "PUT ms"]
        lines += [
            f"## Stored factorizations: {SOLVES} one-right-hand-side solves, float64 (binary)",
            "",
            "`resend` = 10 `/lu_solve` requests, each carrying the n x n LU, its pivots and B. `stored` = 10",
            "`/factorizations/{name}/solve` requests carrying only B, after one `PUT /factorizations/{name}` of A",
            "(`PUT ms`: upload, factorization and storing, once). Medians of 3 runs of the 10 solves; the",
            "answers are checked equal bit for bit. Goal: resend / stored >= 10 at n = 4096.",
            "",
            table(stored_rows, [*stored_columns, "bytes per resend", "bytes per stored"]),
            "",
        ]
    if grpc_rows:
        lines += [
            "## gRPC against HTTP binary (Open Inference Protocol, same run)",
            "",
            "gRPC: `grpc.aio` calls on one HTTP/2 channel (raw tensors, tritonclient's messages). HTTP binary: the",
            "keep-alive client above on `/v2/models/{model}/infer`. The lu_unpack answer is P, L and U (3x the input).",
            "",
            table(
                [r for r in grpc_rows if "req/s" in r], ["case", "protocol", "requests", "req/s", "p50 ms", "p99 ms"]
            ),
            "",
            table([r for r in grpc_rows if "MB/s" in r], ["case", "protocol", "ms", "MB/s"]),
            "",
        ]
    lines += ["## Machine", "", *[f"- {k}: {v}" for k, v in facts.items()], ""]
    return "\n".join(lines)


PARTS = ("transport", "concurrency", "stored", "grpc")
# The service with one part of the transport turned off, for the receive table (no warm-up: nothing computes).
RECEIVE_VARIANTS = {
    "service, no buffer pool (LU_BODY_POOL_BYTES=0)": {"LU_BODY_POOL_BYTES": "0"},
}


def _receive_part(url: str, copier: CopyServer, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    extra = [start_server(LU_WARMUP="false", **env) for env in RECEIVE_VARIANTS.values()]
    try:
        urls = {"service": url, **{name: u for name, (_, u) in zip(RECEIVE_VARIANTS, extra, strict=True)}}
        return receive_cost(urls, copier, 3 if quick else 9, progress)
    finally:
        stop_servers(extra)


def _bare_part(url: str, device: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    """The service against the bare app, the app computing inline and, where the service runs on a GPU,
    the same service on the CPU (``ON_CPU``), alternating round by round."""
    body, headers = binary_body(_small_solve())
    answer = len(httpx.post(f"{url}/solve", content=body, headers=headers).content)
    started: list[tuple[subprocess.Popen, str]] = []
    try:
        started.append(start_server(module="bench._bare_asgi", LU_BARE_ANSWER_BYTES=str(answer)))
        started.append(start_server(module="bench._bare_asgi", LU_BARE_COMPUTE="1"))
        urls = {"service": url, BARE: started[0][1], INLINE: started[1][1]}
        if device != "cpu":
            # No warm-up (on a fresh device machine it compiles every CPU kernel: 69 s on the H100's host);
            # small_vs_bare's warm round compiles the one solve it times, or finds it in Numba's cache.
            started.append(start_server(LU_DEVICE="cpu", LU_WARMUP="false"))
            urls[ON_CPU] = started[-1][1]
            kind = httpx.get(f"{urls[ON_CPU]}/readyz").json()["device"]["kind"]
            if kind != "cpu":
                raise RuntimeError(f"the service started with LU_DEVICE=cpu computes on {kind!r}")
        return small_vs_bare(urls, 16, 1.0 if quick else 3.0, 1 if quick else 3, progress)
    finally:
        stop_servers(started)


def run(quick: bool, out: Path | None, progress: Callable[[str], None], parts: tuple[str, ...] = PARTS) -> Path | None:
    grpc_port = free_port()
    grpc_target = f"127.0.0.1:{grpc_port}"
    grpc_bytes = grpc_payload_bytes((4 if quick else 256) << 20, server_env(grpc_port, False, {}))
    proc, url = start_server(LU_GRPC_PORT=str(grpc_port))
    try:
        device = httpx.get(f"{url}/readyz").json()["device"]["kind"]
        sizes = [64, 128] if quick else [256, 1024, 2048, 4096]
        levels = [1, 4] if quick else [1, 16, 64]
        copier = CopyServer()
        receive_rows = _receive_part(url, copier, quick, progress) if "transport" in parts else []
        transport_rows = transport(url, sizes, copier, progress) if "transport" in parts else []
        conc_rows = concurrency(url, levels, 1.0 if quick else 5.0, progress) if "concurrency" in parts else []
        bare_rows = _bare_part(url, device, quick, progress) if "concurrency" in parts else []
        stored_sizes = [64, 128] if quick else [2048, 4096]
        stored_rows = stored_factorizations(url, stored_sizes, progress) if "stored" in parts else []
        grpc_rows = (
            grpc_vs_http(url, grpc_target, grpc_bytes, 1.0 if quick else 5.0, progress) if "grpc" in parts else []
        )
    finally:
        stop_servers([(proc, url)])
    text = report(transport_rows, conc_rows, stored_rows, grpc_rows, device, receive_rows, bare_rows)
    print(text)
    if out is None:
        return None
    out.mkdir(parents=True, exist_ok=True)
    some = "" if tuple(parts) == PARTS else "-" + "-".join(parts)
    path = out / f"{datetime.date.today().isoformat()}-service-{device}{some}{'-quick' if quick else ''}.md"
    path.write_text(text)
    progress(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and short runs (a smoke test)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for the report ('' for none)")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="parts to run (default: all)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else None
    run(args.quick, out, lambda m: print(f"[service] {m}", file=sys.stderr, flush=True), tuple(args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
