"""Device memory: the pre-upload refusal, out-of-memory during compute, metrics, settings.

The logic lives in ``service.device.Device`` (the GPU inherits it), so the CPU device
of the tests exercises the same code path: it is given a memory limit, or its compute
step fails with ``MemoryError`` as CuPy's allocator would. The tests marked ``gpu`` run
the same scenarios against CuPy's pool on a device (``make gpu-proof``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from service.config import Settings
from service.device import PinnedStaging
from service.operations import OPERATIONS
from tests.service.wire import binary_request

ROOT = Path(__file__).resolve().parents[2]
BODY = {"A": [[3.0, 1.0], [1.0, 2.0]], "B": [9.0, 8.0]}


def _spy(device) -> list[str]:
    """Record every job that reaches the device's compute step."""
    calls: list[str] = []
    real = device._execute

    def execute(compute, tensors, options):
        calls.append(compute.__name__)
        return real(compute, tensors, options)

    device._execute = execute
    return calls


# --------------------------------------------------------------------------- the estimate


@pytest.mark.parametrize(
    ("op", "tensors", "options", "input_bytes", "itemsize"),
    [
        ("lu_factor", {"A": np.zeros((2, 3, 3), np.float32)}, {"pivot": True}, 72, 4),
        ("lu_factor", {"A": np.zeros((3, 3), np.int32)}, {"pivot": True}, 36, 8),  # integers compute in float64
        ("lu", {"A": np.zeros((4, 3), np.complex128)}, {"pivot": True}, 12 * 16, 16),
        # pivots do not set the dtype
        (
            "lu_solve",
            {
                "LU": np.zeros((5, 2, 2), np.float32),
                "pivots": np.ones((5, 2), np.int64),
                "B": np.zeros((2, 1), np.float32),
            },
            {"left": True, "adjoint": False, "check_errors": True},
            80 + 80 + 8,
            4,
        ),
        ("solve", {"A": np.zeros((0, 4, 4)), "B": np.zeros((0, 4, 1))}, {"left": True, "check_errors": True}, 0, 8),
    ],
)
def test_device_bytes_counts_inputs_and_outputs_from_the_shapes(op, tensors, options, input_bytes, itemsize):
    operation = OPERATIONS[op]
    outputs = operation.output_elements(tensors, options)
    assert operation.device_bytes(tensors, options) == input_bytes + outputs * itemsize


def test_device_bytes_grow_with_the_answer_not_only_the_inputs():
    lu = OPERATIONS["lu"]
    tall = {"A": np.zeros((40, 1))}  # 320 bytes in; P alone is 40x40
    assert lu.device_bytes(tall, {"pivot": True}) >= 320 + 40 * 40 * 8


# --------------------------------------------------------------------------- refused before upload


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["json", "binary", "v2"])
async def test_a_request_over_the_limit_is_refused_before_it_reaches_the_device(make_client, rng, form):
    client = await make_client(retry_after_s=7)
    device = client.app.state.worker.device
    device.memory_limit = 4096
    calls = _spy(device)
    A = rng.standard_normal((4, 16, 16))  # 8 KiB of input alone
    if form == "json":
        r = await client.post("/lu_factor", json={"A": A.tolist()})
    elif form == "binary":
        body, headers = binary_request({"A": A})
        r = await client.post("/lu_factor", content=body, headers=headers)
    else:
        inputs = [{"name": "A", "shape": list(A.shape), "datatype": "FP64", "data": A.ravel().tolist()}]
        r = await client.post("/v2/models/lu_factor/infer", json={"inputs": inputs})
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "device_out_of_memory" and r.headers["retry-after"] == "7"
    assert "4096" in r.json()["error"] and r.json()["request_id"]
    assert calls == []  # nothing was computed (on a GPU: nothing was uploaded)
    small = await client.post("/solve", json=BODY)
    assert small.status_code == 200 and small.json()["X"]["data"] == [2.0, 3.0]
    assert calls == ["_solve"]
    metrics = (await client.get("/metrics")).text
    assert 'lu_rejected_total{reason="device_memory_limit"} 1.0' in metrics


@pytest.mark.anyio
async def test_an_output_that_would_not_fit_is_refused_too(make_client):
    client = await make_client()
    device = client.app.state.worker.device
    device.memory_limit = 10_000
    # 8 bytes of input, but P of a 40x1 matrix is 40x40 float64 = 12800 bytes
    r = await client.post("/lu", json={"A": {"dtype": "float64", "shape": [40, 1], "data": [1.0] * 40}})
    assert r.status_code == 503 and r.json()["code"] == "device_out_of_memory"


# --------------------------------------------------------------------------- out of memory during compute


@pytest.mark.anyio
@pytest.mark.parametrize("error", [MemoryError("cannot allocate 64 GiB"), MemoryError()])
async def test_out_of_memory_during_compute_frees_the_pool_answers_503_and_the_next_works(make_client, error):
    client = await make_client(retry_after_s=3)
    device = client.app.state.worker.device
    released: list[bool] = []
    real = device._execute

    def fails_once(compute, tensors, options):
        device._execute = real
        raise error

    device._execute = fails_once
    device.release_memory = lambda: released.append(True)
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 503 and r.json()["code"] == "device_out_of_memory"
    assert r.headers["retry-after"] == "3" and released == [True]
    assert "64 GiB" not in r.json()["error"]  # internals stay in the log
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 200 and r.json()["X"]["data"] == [2.0, 3.0]
    metrics = (await client.get("/metrics")).text
    assert 'lu_rejected_total{reason="device_out_of_memory"} 1.0' in metrics


@pytest.mark.anyio
async def test_other_errors_during_compute_are_not_taken_for_out_of_memory(make_client):
    client = await make_client(raise_app_exceptions=False)
    device = client.app.state.worker.device
    released: list[bool] = []
    device.release_memory = lambda: released.append(True)
    r = await client.post("/solve", json={"A": [[0.0, 0.0], [0.0, 0.0]], "B": [1.0, 1.0]})
    assert r.status_code == 422 and r.json()["code"] == "singular_matrix"
    assert released == []


# --------------------------------------------------------------------------- metrics


@pytest.mark.anyio
async def test_metrics_report_device_memory_and_device_time_per_operation(make_client):
    client = await make_client()
    assert (await client.post("/solve", json=BODY)).status_code == 200
    metrics = (await client.get("/metrics")).text
    assert "lu_device_memory_in_use_bytes 0.0" in metrics
    assert "lu_device_memory_limit_bytes +Inf" in metrics  # the CPU has no limit
    assert "lu_pinned_memory_in_use_bytes 0.0" in metrics
    assert 'lu_device_seconds_count{device="cpu",operation="solve",stage="compute"} 1.0' in metrics
    client.app.state.worker.device.memory_limit = 1 << 20
    assert "lu_device_memory_limit_bytes 1.048576e+06" in (await client.get("/metrics")).text


@pytest.mark.anyio
async def test_readyz_shows_the_memory_limit(make_client):
    client = await make_client()
    client.app.state.worker.device.memory_limit = 12345
    body = (await client.get("/readyz")).json()
    assert body["device"]["memory_limit_bytes"] == 12345


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("value", [0, -1, "many", "1e400", 1.5, [1]])
def test_gpu_memory_settings_refuse_nonsense(value):
    with pytest.raises(ValidationError):
        Settings(gpu_memory_bytes=value)


@pytest.mark.parametrize("value", [-1, "x", None])
def test_gpu_pinned_settings_refuse_nonsense(value):
    with pytest.raises(ValidationError):
        Settings(gpu_pinned_bytes=value)


@pytest.mark.parametrize("value", [-1, "x", None, 2.5, "1e9"])
def test_gpu_host_max_n_refuses_nonsense(value):
    with pytest.raises(ValidationError):
        Settings(gpu_host_max_n=value)


def test_gpu_host_max_n_default_and_environment(monkeypatch):
    assert Settings().gpu_host_max_n == 32
    monkeypatch.setenv("LU_GPU_HOST_MAX_N", "0")
    assert Settings().gpu_host_max_n == 0
    monkeypatch.setenv("LU_GPU_HOST_MAX_N", "-3")
    with pytest.raises(ValidationError, match="gpu_host_max_n"):
        Settings()


def test_gpu_memory_settings_defaults_and_environment(monkeypatch):
    s = Settings()
    assert s.gpu_memory_bytes is None and s.gpu_pinned_bytes == 2 << 30
    monkeypatch.setenv("LU_GPU_MEMORY_BYTES", str(3 << 30))
    monkeypatch.setenv("LU_GPU_PINNED_BYTES", "0")
    s = Settings()
    assert s.gpu_memory_bytes == 3 << 30 and s.gpu_pinned_bytes == 0
    monkeypatch.setenv("LU_GPU_MEMORY_BYTES", "  ")  # as compose and the ConfigMap list it: the default
    assert Settings().gpu_memory_bytes is None


def test_a_bad_memory_setting_stops_the_service_at_start():
    env = {**os.environ, "LU_DEVICE": "cpu", "LU_GPU_MEMORY_BYTES": "lots"}
    done = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "gpu_memory_bytes" in done.stderr


# --------------------------------------------------------------------------- pinned staging


class HostAllocator:
    """CuPy's pinned allocator reduced to what PinnedStaging calls, over ordinary host memory."""

    def __init__(self) -> None:
        self.allocated: list[int] = []

        class Cuda:
            @staticmethod
            def alloc_pinned_memory(size: int) -> bytearray:
                self.allocated.append(size)
                return bytearray(size)

        self.cuda = Cuda


def test_pinned_staging_reuses_buffers_and_respects_its_limit():
    host = HostAllocator()
    staging = PinnedStaging(host, limit=1 << 20)
    assert staging.take(100) is None  # small copies stay pageable
    a = staging.take(300_000)
    assert a is not None and a[0] == 1 << 19 and len(a[1]) >= 300_000
    staging.release([a])
    b = staging.take(400_000)
    assert b is a and host.allocated == [1 << 19]  # the same buffer again
    c = staging.take(300_000)  # a second one while b is in use: 1 MiB held
    assert c is not None and staging.held_bytes == 1 << 20
    assert staging.take(300_000) is None  # over the limit: caller copies from pageable memory
    staging.release([b, c])
    d = staging.take(600_000)  # needs 1 MiB: the idle buffers are dropped to make room
    assert d is not None and d[0] == 1 << 20 and staging.held_bytes == 1 << 20
    staging.release([d])
    staging.clear()
    assert staging.held_bytes == 0


def test_pinned_staging_without_a_limit_and_with_zero():
    unlimited = PinnedStaging(HostAllocator(), limit=None)
    assert unlimited.take(1 << 24) is not None
    nothing = PinnedStaging(HostAllocator(), limit=0)
    assert nothing.take(1 << 20) is None


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.anyio
async def test_gpu_pool_limit_refusal_compute_oom_and_recovery(make_client, rng):
    import cupy

    # gpu_host_max_n=0: the warm-up compiles no CPU kernels (cold on a device machine, over a minute).
    client = await make_client(device="gpu", gpu_memory_bytes=256 << 20, warmup=True, gpu_host_max_n=0)
    device = client.app.state.worker.device
    assert device.kind == "gpu" and device.memory_limit == 256 << 20
    # 200 MB in (under LU_MAX_REQUEST_BYTES' 256 MiB, which answered 413 to 6000 x 6000 on the H100) and
    # 200 MB out: over the 256 MiB limit from its shapes.
    A = rng.standard_normal((1, 5000, 5000))
    body, headers = binary_request({"A": A})
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 503 and r.json()["code"] == "device_out_of_memory"
    # Hold most of the pool (as a stored factorization would), then ask for more than is left.
    hog = client.app.state.worker.call(lambda: cupy.empty(200 << 20, dtype=cupy.uint8))
    A = rng.standard_normal((1, 3000, 3000))  # 72 MB in, 72 MB out: fits the limit, not what is left
    body, headers = binary_request({"A": A})
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 503 and r.json()["code"] == "device_out_of_memory"
    assert hog.size == 200 << 20  # the neighbour's memory survived
    del hog
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 200
    metrics = (await client.get("/metrics")).text
    assert "lu_device_memory_limit_bytes 2.68435456e+08" in metrics
    assert 'stage="upload"' in metrics and 'stage="download"' in metrics


@pytest.mark.anyio
async def test_stored_factorizations_count_against_the_limit_until_deleted(make_client, rng):
    """A request that fits the limit alone but not beside the stored factorizations is refused before the device."""
    client = await make_client(retry_after_s=5)
    device = client.app.state.worker.device
    stored = rng.standard_normal((20, 20)) + 20 * np.eye(20)
    r = await client.put("/factorizations/kept", json={"A": stored.tolist()})
    assert r.status_code == 201, r.text
    held = client.app.state.store.held_bytes
    assert held >= stored.nbytes
    A = rng.standard_normal((3, 12, 12))
    op = OPERATIONS["lu_factor"]
    options, elements = op.prepare_counted({"A": A}, {}, 1 << 30)
    need = op.device_bytes({"A": A}, options, elements)
    device.memory_limit = need + held // 2  # room for the request alone, not beside the stored bytes
    calls = _spy(device)
    body, headers = binary_request({"A": A})
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "device_out_of_memory" and r.headers["retry-after"] == "5"
    assert f"{held} of the {device.memory_limit} bytes" in r.json()["error"]
    assert calls == []
    # The stored factorization is still there and usable (a solve needs far less).
    r = await client.post("/factorizations/kept/solve", json={"B": [[1.0]] * 20})
    assert r.status_code == 200, r.text
    assert (await client.delete("/factorizations/kept")).status_code == 204
    r = await client.post("/lu_factor", content=body, headers=headers)
    assert r.status_code == 200, r.text
    metrics = (await client.get("/metrics")).text
    assert 'lu_rejected_total{reason="device_memory_stored"} 1.0' in metrics
    assert 'reason="device_memory_limit"' not in metrics


@pytest.mark.anyio
async def test_a_request_using_a_stored_factorization_does_not_count_it_twice(make_client, rng):
    """A stored entry over half the limit is still usable: its bytes are the request's own, not in its way."""
    client = await make_client()
    device = client.app.state.worker.device
    stored = rng.standard_normal((60, 60)) + 60 * np.eye(60)
    assert (await client.put("/factorizations/big", json={"A": stored.tolist()})).status_code == 201
    held = client.app.state.store.held_bytes
    device.memory_limit = held + held // 2  # the entry takes two thirds of the limit
    calls = _spy(device)
    B = rng.standard_normal((60, 1))
    body, headers = binary_request({"B": B})
    r = await client.post("/factorizations/big/solve", content=body, headers=headers)
    assert r.status_code == 200, r.text
    body, headers = binary_request({"B": rng.standard_normal((60, 8))})
    r = await client.post("/factorizations/big/solve", content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert len(calls) == 2
    # A second, different request of the same size does not fit beside the stored entry.
    body, headers = binary_request({"A": stored, "B": B})
    r = await client.post("/solve", content=body, headers=headers)
    assert r.status_code == 503 and "hold stored factorizations" in r.json()["error"], r.text


def test_a_leased_buffer_returns_without_the_lock_even_inside_a_collection_under_it():
    """The lease's finalizer may run inside a garbage collection that an allocation made while the same
    thread held the staging lock (a threading.Lock: not re-entrant): it must not take the lock. Here the
    answer is dropped by another thread while this one holds the lock: it returns at once, and the buffer
    is back in the free list after the lock is free again."""
    import threading

    staging = PinnedStaging(HostAllocator(), limit=1 << 20)
    answer = [staging.lease((100_000,), np.uint8)]
    assert answer[0] is not None and staging.idle() == 0
    with staging._lock:
        dropper = threading.Thread(target=answer.clear)
        dropper.start()
        dropper.join(5)
        assert not dropper.is_alive(), "the finalizer waited for the staging lock"
    assert staging.idle() == 1 and staging.held_bytes == 1 << 17


def test_pinned_staging_accounting_survives_failures_and_clears():
    host = HostAllocator()
    staging = PinnedStaging(host, limit=1 << 20)
    broken = HostAllocator()
    broken.cuda.alloc_pinned_memory = staticmethod(lambda size: (_ for _ in ()).throw(MemoryError("pinned")))
    failing = PinnedStaging(broken, limit=1 << 20)
    with pytest.raises(MemoryError):
        failing.take(300_000)
    assert failing.held_bytes == 0  # counted before the allocation, given back when it failed
    leased = staging.lease((300_000,), np.uint8)
    staging.clear()  # a leased buffer is not idle: still counted
    assert staging.held_bytes == 1 << 19 and staging.idle() == 0
    del leased
    assert staging.idle() == 1
    freed = []
    host.get_default_pinned_memory_pool = lambda: type("Pool", (), {"free_all_blocks": lambda self: freed.append(1)})()
    assert staging.take(600_000) is not None  # needs the room of the idle buffer: dropped, and the pool told
    assert freed == [1] and staging.held_bytes == 1 << 20


def test_at_the_pinned_cap_only_the_idle_buffers_needed_are_dropped_largest_first():
    staging = PinnedStaging(HostAllocator(), limit=1280 << 10)
    a, b = staging.take(300_000), staging.take(100_000)  # 512 KiB and 128 KiB
    staging.release([a, b])
    big = staging.take(600_000)  # 1 MiB: 640 KiB idle + 1 MiB > the cap; dropping the 512 KiB one is room enough
    assert big is not None and staging.held_bytes == (1024 + 128) << 10 and staging.idle() == 1
    assert staging.take(100_000) is b  # the small idle buffer was kept
