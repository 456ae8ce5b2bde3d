"""The service parts of the GPU proof: ``python -m service`` end to end, and device memory.

Every check talks to a real ``python -m service`` process on loopback, started with the
proof's ``LU_DEVICE``, through the clients a user has: plain HTTP (JSON), ``lu_client``
(binary framing) and ``tritonclient.http`` (``/v2``). Answers are checked against
``lu_core`` on the CPU (NumPy), by reconstruction with per-dtype tolerances, since a GPU's
rounding differs from the CPU's. Features that other issues add (stored factorizations,
dynamic batching) are detected from the OpenAPI document and the settings, and checked
when present.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import lu_core

if TYPE_CHECKING:
    from bench.gpu_proof import Outcome, Proof

ROOT = Path(__file__).resolve().parents[1]
KEY = "gpu-proof-key"
AUTH = {"authorization": f"Bearer {KEY}"}
TOL = {np.float32: 2e-4, np.float64: 1e-10, np.complex64: 2e-4, np.complex128: 1e-10}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m service`` in a subprocess; its log lines are kept for the proof's file."""

    def __init__(self, env: dict[str, str], **settings: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {**env, "LU_PORT": str(self.port), "LU_API_KEY": KEY, "LU_LOG_LEVEL": "info", **settings}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service"], cwd=ROOT, env=full, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_ready(self, timeout: float) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the service exited with {self.proc.returncode}:\n{''.join(self.lines[-30:])}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"not ready after {timeout:.0f} s:\n{''.join(self.lines[-30:])}")

    def stop(self, grace: float = 60) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        return self.proc.returncode


class Checks:
    """Named checks; each one records a pass or a failure with a detail, and never raises."""

    def __init__(self, proof: Proof, prefix: str) -> None:
        self.proof = proof
        self.prefix = prefix
        self.failed: list[str] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> Any:
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as exc:
            detail, ok = f"{type(exc).__name__}: {exc}", False
        ms = (time.perf_counter() - t0) * 1e3
        mark = "ok" if ok else "FAILED"
        line = f"{self.prefix} {name}: {mark} ({ms:.0f} ms){' - ' + detail if detail else ''}"
        self.proof.checks.append(line[:400])
        self.proof.append("service.log", line)
        self.proof.log(line[:200])
        if not ok:
            self.failed.append(name)


def _close(got: np.ndarray, want: np.ndarray, dtype: Any) -> None:
    tol = TOL[np.dtype(dtype).type]
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} != {want.shape}")
    scale = max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    if not err <= tol * max(1, want.shape[-1] if want.ndim else 1):
        raise AssertionError(f"relative error {err:.2e} over {tol:.0e}")


def _system(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    n = shape[-1]
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return (a + n * np.eye(n)).astype(dtype)


def _json_tensor(a: np.ndarray) -> dict[str, Any]:
    data = np.stack([a.real, a.imag], axis=-1).tolist() if a.dtype.kind == "c" else a.tolist()
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": data}


def _from_json(t: dict[str, Any]) -> np.ndarray:
    dtype = np.dtype(t["dtype"])
    raw = np.array(t["data"], dtype=np.float64 if dtype.kind == "c" else dtype)
    if dtype.kind == "c":
        raw = raw[..., 0] + 1j * raw[..., 1]
    return raw.astype(dtype).reshape(t["shape"])


# --------------------------------------------------------------------------- end to end


def end_to_end(p: Proof) -> Outcome:
    import httpx

    from bench.gpu_proof import Outcome

    sys.path.insert(0, str(ROOT / "clients"))
    env = dict(p.env)
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "clients"), env["PYTHONPATH"]))
    # LU_GPU_HOST_MAX_N=0: every check computes on the device (the small requests below would otherwise be
    # computed on the host, and the proof would not see the GPU service path, nor its merges).
    # LU_BODY_POOL_BYTES: room for both 256 MiB transfer checks' receive buffers (320 + 256 MiB), so that
    # keeping the second does not evict the first (and its pinned bytes) while the proof watches the gauge.
    server = Server(env, LU_WARMUP="true", LU_MAX_REQUEST_BYTES=str(1 << 30), LU_MAX_ELEMENTS=str(1 << 28),
                    LU_GPU_HOST_MAX_N="0", LU_BODY_POOL_BYTES=str(1 << 30))  # fmt: skip
    checks = Checks(p, "service")
    rng = np.random.default_rng(20)
    deadline = time.monotonic() + p.limit("service")
    try:
        ready_s = server.wait_ready(p.limit("service") / 2)
        p.facts["service ready after"] = f"{ready_s:.1f} s (warm-up included)"
        http = httpx.Client(base_url=server.url, headers=AUTH, timeout=120)
        openapi = http.get("/openapi.json").json()
        paths = set(openapi.get("paths", {}))

        def readyz() -> str:
            body = http.get("/readyz").json()
            kind = body["device"]["kind"]
            if kind != p.device:
                raise AssertionError(f"the service computes on {kind}, the proof asked for {p.device}")
            return f"{kind}: {body['device'].get('name')}; versions {body.get('versions')}"

        checks.run("readyz reports the asked device", readyz)

        def native_json() -> str:
            for dtype in (np.float64, np.complex64):
                A = _system(rng, (4, 16, 16), dtype)
                B = rng.standard_normal((4, 16, 3)).astype(dtype)
                r = http.post("/solve", json={"A": _json_tensor(A), "B": _json_tensor(B)})
                r.raise_for_status()
                _close(_from_json(r.json()["X"]), np.linalg.solve(A, B), dtype)
                r = http.post("/lu_factor", json={"A": _json_tensor(A)})
                r.raise_for_status()
                out = r.json()
                P, L, U = lu_core.lu_unpack(_from_json(out["LU"]), _from_json(out["pivots"]))
                _close(P @ L @ U, A, dtype)
            return "/solve and /lu_factor, float64 and complex64, match numpy / reconstruct A"

        checks.run("native JSON", native_json)

        def binary_client() -> str:
            from lu_client import LUClient

            with LUClient(server.url, api_key=KEY) as client:
                for dtype in (np.float32, np.float64, np.complex64, np.complex128):
                    A = _system(rng, (8, 32, 32), dtype)
                    B = rng.standard_normal((8, 32, 2)).astype(dtype)
                    LU, piv = client.lu_factor(A)
                    P, L, U = client.lu_unpack(LU, piv)
                    _close(P @ L @ U, A, dtype)
                    _close(client.lu_solve(LU, piv, B), np.linalg.solve(A, B), dtype)
                    _close(client.solve(A, B), np.linalg.solve(A, B), dtype)
                    P2, L2, U2 = client.lu(A)
                    _close(P2 @ L2 @ U2, A, dtype)
                if p.device == "gpu":  # the large path (cuSOLVER); on a CI machine's CPU it only costs time
                    big = _system(rng, (1, 1024, 1024), np.float64)
                    b = rng.standard_normal((1, 1024, 1))
                    _close(client.solve(big, b), np.linalg.solve(big, b), np.float64)
            return "lu_client (binary framing): all five operations, four dtypes (and one 1024x1024 solve on a GPU)"

        checks.run("binary native routes", binary_client)

        for binary in (True, False):
            checks.run(f"/v2 through tritonclient.http ({'binary' if binary else 'JSON'})",
                       lambda binary=binary: _triton(server.port, rng, binary))  # fmt: skip

        if "/factorizations/{name}" in paths:
            checks.run("stored factorizations", lambda: _stored(http, rng))
        else:
            p.checks.append("service stored factorizations: not present in this build (no /factorizations route)")

        checks.run("concurrent 8x8 /solve (batching where enabled)", lambda: _concurrent(server.url, http, rng))

        def metrics() -> str:
            text = http.get("/metrics").text
            found = [
                line
                for line in text.splitlines()
                if line.startswith(("lu_device_memory", "lu_pinned_memory")) and not line.startswith("#")
            ]
            if p.device == "gpu" and not any(ln.startswith("lu_device_memory_limit_bytes") for ln in found):
                raise AssertionError("no lu_device_memory_limit_bytes on a GPU")
            timed = [ln for ln in text.splitlines() if ln.startswith("lu_device_seconds_count")]
            return f"{'; '.join(found) or 'no device memory gauges (CPU)'}; {len(timed)} device-time series"

        checks.run("/metrics device memory and device time", metrics)
        if p.device == "gpu":
            for op in ("lu_solve", "lu_unpack"):
                checks.run(f"256 MiB binary /{op}: device part against a bare pinned copy",
                           lambda op=op: _transfer_budget(http, op, server))  # fmt: skip
        http.close()
        if time.monotonic() > deadline:
            checks.failed.append("time limit")
    except Exception as exc:
        checks.failed.append(f"start: {exc}")
        p.append("service.log", f"the service did not start: {exc}")
    finally:
        t0 = time.perf_counter()
        code = server.stop()
        # The tail: 3000 lines hold a whole run's log (about 150 lines) and a slow first request's stack dumps.
        p.append("service.log", "\n--- server log ---\n" + "".join(server.lines[-3000:]))
        p.checks.append(f"service SIGTERM: exit {code} after {time.perf_counter() - t0:.1f} s")
    if checks.failed:
        return Outcome("failed", f"failed: {', '.join(checks.failed)}")
    return Outcome("ok", f"{len(p.checks)} checks passed on the {p.device}")


def _triton(port: int, rng: np.random.Generator, binary: bool) -> str:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        if not (client.is_server_live(headers=dict(AUTH)) and client.is_model_ready("lu_solve", headers=dict(AUTH))):
            raise AssertionError("not live or lu_solve not ready")
        A = _system(rng, (16, 8, 8), np.float32)
        inputs = [httpclient.InferInput("A", list(A.shape), "FP32")]
        inputs[0].set_data_from_numpy(A, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("LU", "pivots", "info")]
        res = client.infer("lu_factor", inputs, outputs=outputs, headers=dict(AUTH))
        LU, piv = res.as_numpy("LU"), res.as_numpy("pivots")
        P, L, U = lu_core.lu_unpack(LU, piv)
        _close(P @ L @ U, A, np.float32)
        B = rng.standard_normal((16, 8, 2)).astype(np.float32)
        solve_in = []
        for name, arr, dt in (("LU", LU, "FP32"), ("pivots", piv, "INT32"), ("B", B, "FP32")):
            t = httpclient.InferInput(name, list(arr.shape), dt)
            t.set_data_from_numpy(arr, binary_data=binary)
            solve_in.append(t)
        X = client.infer(
            "lu_solve", solve_in, outputs=[httpclient.InferRequestedOutput("X", binary_data=binary)],
            parameters={"adjoint": True}, headers=dict(AUTH),
        ).as_numpy("X")  # fmt: skip
        _close(X, np.linalg.solve(np.conj(np.swapaxes(A, -1, -2)), B), np.float32)
    finally:
        client.close()
    return "lu_factor and adjoint lu_solve, float32"


def _samples(http: Any, prefix: str) -> list[tuple[str, float]]:
    """(line, value) of each /metrics sample whose line starts with ``prefix``."""
    return [(ln, float(ln.split()[-1])) for ln in http.get("/metrics").text.splitlines() if ln.startswith(prefix)]


def _metric(http: Any, name: str) -> float:
    """An unlabelled gauge's value from /metrics (0 when absent: the CPU has no pinned receive buffers)."""
    return next((value for _, value in _samples(http, name + " ")), 0.0)


def _device_seconds(http: Any, op: str) -> dict[str, float]:
    return {
        line.split('stage="', 1)[1].split('"', 1)[0]: value
        for line, value in _samples(http, "lu_device_seconds_sum{")
        if f'operation="{op}"' in line
    }


def _bare_copy_seconds(up: int, down: int) -> float:
    """Median of a pinned host-to-device copy of ``up`` bytes plus device-to-host of ``down`` bytes."""
    import cupy

    host_up = cupy.cuda.alloc_pinned_memory(up)
    host_down = cupy.cuda.alloc_pinned_memory(down)
    dev_up, dev_down = cupy.empty(up, cupy.uint8), cupy.empty(down, cupy.uint8)
    a_up = np.frombuffer(host_up, np.uint8, up)
    a_down = np.frombuffer(host_down, np.uint8, down)
    times = []
    for _ in range(5):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        dev_up.set(a_up)
        dev_down.get(out=a_down)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return float(np.median(times))


class StacksWhileSlow:
    """While a request runs: at each of ``marks`` seconds, if it has not been answered, SIGUSR1 to the
    server, which then writes every thread's Python stack to its log (``python -m service`` registers
    faulthandler for it): what a slow first request spends its time on, seen from inside."""

    def __init__(self, server: Server, marks: tuple[float, ...] = (1.0, 3.0)) -> None:
        self.server, self.marks = server, marks
        self.sent: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        start = time.monotonic()
        for mark in self.marks:
            if self._done.wait(max(0.0, start + mark - time.monotonic())) or self.server.proc.poll() is not None:
                return
            self.server.proc.send_signal(signal.SIGUSR1)
            self.sent.append(mark)

    def __enter__(self) -> StacksWhileSlow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def said(self) -> str:
        return f"; stacks dumped at {', '.join(f'{m:g} s' for m in self.sent)} (service.log)" if self.sent else ""


def _transfer_budget(http: Any, op: str, server: Server) -> str:
    """Issue 20's target: upload + compute + download within 1.3x of a bare pinned copy of the same bytes.
    The first request of the size is watched: past 1 and 3 s, the server's threads' stacks go to its log
    (the first 5792² solve spent 5.8-6.3 s in compute on the H100, the library's alone 3 ms)."""
    from bench.service import binary_body, streamed

    n = 5792  # LU of 5792^2 float64: 256 MiB
    rng = np.random.default_rng(5)
    LU = np.triu(rng.standard_normal((n, n))) + n * np.eye(n)
    piv = np.arange(1, n + 1, dtype=np.int32)
    tensors = {"LU": LU, "pivots": piv} if op == "lu_unpack" else {"LU": LU, "pivots": piv, "B": np.ones((n, 1))}
    body, headers = binary_body(tensors, {"unpack_pivots": False} if op == "lu_unpack" else None)
    # Twice: the first request of a size allocates its pinned buffers (and, before the warm-up reached
    # every library, loaded cuSOLVER: 4.4 s on the first H200); the second is the steady state: its body
    # lands in the first one's receive buffer, page-locked in the background meanwhile (service.pinning),
    # so that its tensors go up without staging (waited for here, up to 10 s).
    runs = []
    pinned = before_pinned = _metric(http, "lu_body_pool_pinned_bytes")
    for i in range(2):
        if i:  # this body's buffer pinned: the gauge up by at least its size
            until = time.monotonic() + 10
            while (pinned := _metric(http, "lu_body_pool_pinned_bytes")) - before_pinned < len(body):
                if time.monotonic() > until:
                    break
                time.sleep(0.05)
        before = _device_seconds(http, op)
        t0 = time.perf_counter()
        with StacksWhileSlow(server, () if i else (1.0, 3.0)) as watch:
            r = http.post(f"/{op}", **streamed(body, headers))
        wall = time.perf_counter() - t0
        if not i:
            dumped = watch.said()
        r.raise_for_status()
        after = _device_seconds(http, op)
        runs.append(({k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("upload", "compute", "download")}, wall))
    bare = _bare_copy_seconds(len(body), len(r.content))
    said = []
    for label, (stages, wall) in zip(("first", "again"), runs, strict=True):
        device = sum(stages.values())
        parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in stages.items())
        said.append(f"{label}: device part {device * 1e3:.1f} ms ({parts}) = {device / bare:.2f}x; "
                    f"round trip {wall * 1e3:.0f} ms")  # fmt: skip
    text = (f"{'; '.join(said)}; a bare pinned copy {bare * 1e3:.1f} ms (target <= 1.3x, again); receive "
            f"buffers page-locked before again: {(pinned - before_pinned) / 2**20:.0f} MiB more{dumped}")  # fmt: skip
    if pinned - before_pinned < len(body):
        raise AssertionError(f"the body's receive buffer was not page-locked within 10 s (service.pinning): {text}")
    return text


def _stored(http: Any, rng: np.random.Generator) -> str:
    A = _system(rng, (3, 24, 24), np.float64)
    B = rng.standard_normal((3, 24, 2))
    r = http.put("/factorizations/gpu-proof-a", json={"A": _json_tensor(A)})
    r.raise_for_status()
    r = http.post("/factorizations/gpu-proof-a/solve", json={"B": _json_tensor(B)})
    r.raise_for_status()
    _close(_from_json(r.json()["X"]), np.linalg.solve(A, B), np.float64)
    names = http.get("/factorizations").text
    if "gpu-proof-a" not in names:
        raise AssertionError(f"GET /factorizations does not list it: {names[:200]}")
    http.get("/factorizations/gpu-proof-a").raise_for_status()
    http.delete("/factorizations/gpu-proof-a").raise_for_status()
    if http.get("/factorizations/gpu-proof-a").status_code != 404:
        raise AssertionError("still there after DELETE")
    return "PUT, solve, GET, list, DELETE"


def _concurrent(url: str, http: Any, rng: np.random.Generator) -> str:
    """32 distinct 8x8 systems, alone then all at once: the answers must be bit-identical."""
    import httpx

    systems = [(_system(rng, (8, 8), np.float64), rng.standard_normal((8, 1))) for _ in range(32)]

    def solve(client: httpx.Client, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        r = client.post("/solve", json={"A": _json_tensor(A), "B": _json_tensor(B)})
        r.raise_for_status()
        return _from_json(r.json()["X"])

    alone = [solve(http, A, B) for A, B in systems]
    clients = [httpx.Client(base_url=url, headers=AUTH, timeout=60) for _ in range(16)]
    try:
        with ThreadPoolExecutor(16) as pool:
            together = list(pool.map(lambda i: solve(clients[i % 16], *systems[i]), range(32)))
    finally:
        for c in clients:
            c.close()
    differ = [i for i in range(32) if not np.array_equal(alone[i], together[i])]
    if differ:
        raise AssertionError(f"answers of systems {differ} differ when sent together")
    batches = [ln for ln in http.get("/metrics").text.splitlines() if ln.startswith("lu_batch") and "_count" in ln]
    return f"32 answers bit-identical alone and together; {'; '.join(batches) or 'no batching metrics in this build'}"


# --------------------------------------------------------------------------- device memory


def out_of_memory(p: Proof) -> Outcome:
    """On a GPU: the pre-upload refusal, the compute-time out-of-memory, and recovery."""
    import httpx

    from bench.gpu_proof import Outcome
    from bench.service import binary_body as binary_request
    from bench.service import streamed

    cap = 1 << 30
    server = Server(
        p.env, LU_WARMUP="true", LU_GPU_MEMORY_BYTES=str(cap), LU_MAX_REQUEST_BYTES=str(4 << 30),
        LU_MAX_ELEMENTS=str(1 << 30), LU_RETRY_AFTER_S="3", LU_GPU_HOST_MAX_N="0",
    )  # fmt: skip
    # LU_GPU_HOST_MAX_N=0: the small checks run on the device too, and the warm-up compiles no CPU
    # kernels (cold, on a fresh device machine, that took longer than the wait below: the H100 run).
    checks = Checks(p, "oom")
    rng = np.random.default_rng(21)
    try:
        server.wait_ready(p.limit("oom") / 2)
        http = httpx.Client(base_url=server.url, headers=AUTH, timeout=120)

        def in_use() -> float:
            for line in http.get("/metrics").text.splitlines():
                if line.startswith("lu_device_memory_in_use_bytes"):
                    return float(line.split()[-1])
            raise AssertionError("no lu_device_memory_in_use_bytes")

        def small_works() -> None:
            A = _system(rng, (2, 8, 8), np.float64)
            B = rng.standard_normal((2, 8, 1))
            r = http.post("/solve", json={"A": _json_tensor(A), "B": _json_tensor(B)})
            r.raise_for_status()
            _close(_from_json(r.json()["X"]), np.linalg.solve(A, B), np.float64)

        def refused_before_upload() -> str:
            n = 12000  # 1.15 GB of float64 input alone: over the 1 GiB cap from its shape
            A = np.ones((1, n, n))
            body, headers = binary_request({"A": A, "B": np.ones((1, n, 1))})
            del A
            r = http.post("/solve", **streamed(body, headers))
            if r.status_code != 503 or r.json().get("code") != "device_out_of_memory" or "retry-after" not in r.headers:
                raise AssertionError(f"{r.status_code} {r.text[:200]}")
            used = in_use()
            if used > 64 << 20:
                raise AssertionError(f"{used:.0f} bytes in use after a refusal")
            small_works()
            return f"503 device_out_of_memory, Retry-After {r.headers['retry-after']}; {used:.0f} bytes in use after"

        checks.run("a request over LU_GPU_MEMORY_BYTES is refused before upload", refused_before_upload)

        def during_compute() -> str:
            # Fits the cap by its shapes (A, B and X: ~0.5 GiB), but lu_core needs a second
            # copy of A for the factorization plus workspace: the pool limit stops it mid-way.
            n = 8300
            A = _system(rng, (1, n, n), np.float64)
            body, headers = binary_request({"A": A, "B": np.ones((1, n, 1))})
            r = http.post("/solve", **streamed(body, headers))
            small_works()
            if r.status_code == 200:
                return "not triggered: the solve fitted in the cap (informational)"
            if r.status_code != 503 or r.json().get("code") != "device_out_of_memory":
                raise AssertionError(f"{r.status_code} {r.text[:200]}")
            return "503 device_out_of_memory during compute, pool freed, the next request worked"

        checks.run("an allocation failure during compute is a 503 and the service goes on", during_compute)
        http.close()
    except Exception as exc:
        checks.failed.append(f"start: {exc}")
    finally:
        server.stop()
        p.append("service.log", "\n--- oom server log ---\n" + "".join(server.lines[-200:]))
    if checks.failed:
        return Outcome("failed", f"failed: {', '.join(checks.failed)}")
    return Outcome("ok", "refused before upload; compute-time OOM answered; recovered")
