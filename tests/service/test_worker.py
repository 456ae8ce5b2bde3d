"""The device worker: bounded queue (503 + Retry-After), out-of-memory (503, keeps serving), shutdown."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from service.device import CpuDevice
from service.metrics import Metrics
from service.operations import OPERATIONS
from service.worker import DeviceWorker

pytestmark = pytest.mark.anyio

BODY = {"A": [[3.0, 1.0], [1.0, 2.0]], "B": [9.0, 8.0]}


class GatedDevice(CpuDevice):
    """A CPU device whose jobs wait for a gate, so the queue can be filled on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Event()

    def run(self, compute, tensors, options):
        self.started.set()
        self.gate.wait(10)
        return super().run(compute, tensors, options)


async def test_full_queue_answers_503_with_retry_after(make_client):
    client = await make_client(max_queue=2, retry_after_s=7)
    device = GatedDevice()
    client.app.state.worker.device = device
    running = asyncio.ensure_future(client.post("/solve", json=BODY))
    await asyncio.to_thread(device.started.wait, 10)
    queued = [asyncio.ensure_future(client.post("/solve", json=BODY)) for _ in range(2)]
    while client.app.state.worker.depth < 2:
        await asyncio.sleep(0.01)
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 503 and r.json()["code"] == "overloaded"
    assert r.headers["retry-after"] == "7"
    device.gate.set()
    for done in await asyncio.gather(running, *queued):
        assert done.status_code == 200 and done.json()["X"]["data"] == [2.0, 3.0]
    metrics = (await client.get("/metrics")).text
    assert 'lu_rejected_total{reason="queue_full"} 1.0' in metrics


async def test_out_of_memory_is_503_and_the_service_goes_on(make_client):
    client = await make_client()
    device = client.app.state.worker.device
    released = []
    real_run = device.run

    def failing_run(compute, tensors, options):
        device.run = real_run
        raise MemoryError("cannot allocate 64 GiB")

    device.run = failing_run
    device.release_memory = lambda: released.append(True)
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 503 and r.json()["code"] == "device_out_of_memory" and "retry-after" in r.headers
    assert released == [True]
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 200


async def test_an_unexpected_bug_is_a_logged_500_without_internals(make_client, caplog):
    client = await make_client(raise_app_exceptions=False)
    device = client.app.state.worker.device
    real_run = device.run

    def buggy(compute, tensors, options):
        device.run = real_run
        raise RuntimeError("secret internal detail")

    device.run = buggy
    r = await client.post("/solve", json=BODY)
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    assert "secret" not in r.text and "secret internal detail" in caplog.text
    assert (await client.post("/solve", json=BODY)).status_code == 200


def test_stop_finishes_queued_jobs_then_refuses():
    async def scenario():
        device = GatedDevice()
        worker = DeviceWorker(device, Metrics("cpu", "test"), max_queue=4, retry_after_s=1)
        worker.start()
        op = OPERATIONS["solve"]
        opts = dict(op.options)
        tensors = {"A": np.eye(2), "B": np.ones(2)}
        jobs = [asyncio.ensure_future(worker.submit("solve", op.compute, tensors, opts)) for _ in range(3)]
        await asyncio.sleep(0.05)
        stopper = asyncio.ensure_future(asyncio.to_thread(worker.stop, 10))
        await asyncio.sleep(0.05)
        device.gate.set()
        await stopper
        results = await asyncio.gather(*jobs)
        assert all(np.array_equal(r["X"], np.ones(2)) for r in results)
        with pytest.raises(Exception, match="not accepting") as excinfo:
            await worker.submit("solve", op.compute, tensors, opts)
        assert excinfo.value.status == 503

    asyncio.run(scenario())


def test_the_worker_thread_has_room_for_openblas_threaded_getrf():
    """SciPy's OpenBLAS needs 3-5 MiB of stack in dgetrf_parallel (n = 290): with a small default thread
    stack the worker would crash the process (SIGSEGV), so it starts with its own (WORKER_STACK_BYTES).
    The same solve on each LAPACK lu_core can call (``LU_CORE_LAPACK``)."""
    import os
    import subprocess
    import sys

    code = """
import asyncio, threading
import numpy as np
threading.stack_size(1 << 20)  # a small default for new threads: the worker must not inherit it
from service.device import CpuDevice
from service.metrics import Metrics
from service.operations import OPERATIONS
from service.worker import DeviceWorker
worker = DeviceWorker(CpuDevice(), Metrics("cpu", "test"), max_queue=4, retry_after_s=1)
worker.start()
rng = np.random.default_rng(0)
A, B = rng.standard_normal((290, 290)) + 290 * np.eye(290), rng.standard_normal((290, 2))
op = OPERATIONS["solve"]
out = asyncio.run(worker.submit("solve", op.compute, {"A": A, "B": B}, dict(op.options)))
assert np.allclose(A @ out["X"], B), "wrong answer"
assert threading.stack_size() == 1 << 20, "the process-wide default was not restored"
worker.stop(10)
print("ok")
"""
    from lu_core._cpu import _mkl

    for lapack in ("scipy", "mkl") if _mkl.library_path() else ("scipy",):  # OpenBLAS's stack need, then MKL's
        env = {**os.environ, "LU_CORE_LAPACK": lapack}
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (lapack, run.returncode, run.stderr[-2000:])


async def test_a_bug_in_the_worker_is_a_500_and_the_worker_goes_on(make_client, caplog):
    """An exception outside the per-job error handling (a bug in the worker's own bookkeeping) must not
    end the worker thread or leave the request waiting forever: that request gets a 500, the next works."""
    client = await make_client(raise_app_exceptions=False)
    worker = client.app.state.worker
    real = worker._compute_seconds

    def broken(name):
        worker._compute_seconds = real
        raise RuntimeError("bookkeeping bug")

    worker._compute_seconds = broken
    r = await asyncio.wait_for(client.post("/solve", json=BODY), 30)
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    for _ in range(200):  # the worker logs it (with its traceback) after the answers are handed back
        if "bookkeeping bug" in caplog.text:
            break
        await asyncio.sleep(0.01)
    assert "bookkeeping bug" in caplog.text
    r = await asyncio.wait_for(client.post("/solve", json=BODY), 30)
    assert r.status_code == 200 and r.json()["X"]["data"] == [2.0, 3.0]
    assert worker._thread.is_alive()
