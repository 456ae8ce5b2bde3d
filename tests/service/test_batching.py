"""Dynamic batching: queued compatible jobs run as one call, and every answer is bit-identical to the
job served alone; failures stay with their own request; incompatible jobs keep their order."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from starlette.requests import ClientDisconnect

import lu_core
from service.batcher import MERGEABLE
from service.device import CpuDevice
from service.metrics import Metrics
from service.operations import OPERATIONS
from service.worker import DeviceWorker
from tests.service.wire import binary_request

pytestmark = pytest.mark.anyio

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
BATCHES = [(), (3,), (2, 2), (1,), (0,)]


def rand(rng, shape, dtype) -> np.ndarray:
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def inputs_for(op: str, batch: tuple[int, ...], n: int, dtype, rng) -> dict[str, np.ndarray]:
    A = rand(rng, (*batch, n, n), dtype) + n * np.eye(n, dtype=dtype)
    LU, piv = lu_core.lu_factor(A)
    return {
        "lu_factor": {"A": A},
        "lu": {"A": A},
        "lu_unpack": {"LU": np.ascontiguousarray(LU), "pivots": piv},
        "lu_solve": {"LU": np.ascontiguousarray(LU), "pivots": piv, "B": rand(rng, (*batch, n, 3), dtype)},
        "solve": {"A": A, "B": rand(rng, (*batch, n), dtype)},  # a vector per system
        "det": {"A": A},
        "slogdet": {"A": A},
        "solve_refined": {"A": A, "B": rand(rng, (*batch, n, 2), dtype)},
        "lu_rcond": {"LU": np.ascontiguousarray(LU), "pivots": piv, "anorm": np.abs(A).sum(-2).max(-1).real},
    }[op]


def hold(worker: DeviceWorker) -> tuple[threading.Event, threading.Thread]:
    """Occupy the worker thread until the returned gate is set."""
    gate, held = threading.Event(), threading.Event()

    def wait() -> None:
        held.set()
        gate.wait(60)

    holder = threading.Thread(target=worker.call, args=(wait,))
    holder.start()
    held.wait(60)
    return gate, holder


async def run_gated(worker: DeviceWorker, jobs: list[tuple[str, dict, dict]]) -> list[object]:
    """Queue ``jobs`` while the worker is held, then let it go: they are there to be merged."""
    gate, holder = hold(worker)
    futures = [
        asyncio.ensure_future(worker.submit(name, OPERATIONS[name].compute, tensors, options))
        for name, tensors, options in jobs
    ]
    await asyncio.sleep(0.05)
    gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    holder.join()
    return results


def batch_calls(metrics: Metrics) -> dict[str, float]:
    """lu_batch_size histogram: (calls, requests)."""
    text = metrics.render().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("lu_batch_size_count", "lu_batch_size_sum")):
            key, value = line.split()
            values[key] = float(value)
    return values


@pytest.fixture
def worker():
    metrics = Metrics("cpu", "test")
    w = DeviceWorker(CpuDevice(), metrics, max_queue=256, retry_after_s=1, max_batch=64)
    w.metrics = metrics  # type: ignore[attr-defined]
    w.start()
    yield w
    w.stop(10)


def assert_bit_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        if want[k] is None:
            assert got[k] is None
            continue
        assert isinstance(got[k], np.ndarray), k  # 0-d answers too: the encoders take arrays
        g, w = np.asarray(got[k]), np.asarray(want[k])
        assert g.shape == w.shape and g.dtype == w.dtype, k
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes(), k


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("dtype", DTYPES)
# Batches of several shapes; and single matrices only (service.batcher's path for many small requests).
@pytest.mark.parametrize("batches", [BATCHES, [()] * 5], ids=["batches", "single"])
async def test_merged_answers_are_bit_identical_to_alone(worker, op, dtype, batches):
    rng = np.random.default_rng(7)
    options = {k: getattr(v, "default", v) for k, v in OPERATIONS[op].options.items()}  # (Option or a bool)
    for n in (3, 8, 33, 64):
        jobs = [(op, inputs_for(op, batch, n, dtype, rng), options) for batch in batches]
        before = batch_calls(worker.metrics)
        results = await run_gated(worker, jobs)
        after = batch_calls(worker.metrics)
        # One call for all of them (plus none other): requests / calls == len(jobs); iterative ones run alone.
        calls = 1 if op in MERGEABLE else len(jobs)
        assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == calls, (op, n)
        assert after["lu_batch_size_sum"] - before.get("lu_batch_size_sum", 0) == len(jobs)
        for (name, tensors, opts), got in zip(jobs, results, strict=True):
            alone = OPERATIONS[name].compute(tensors, opts)
            assert_bit_identical(got, alone)


async def test_a_singular_request_fails_alone_with_its_own_indices(worker):
    rng = np.random.default_rng(1)
    good = [inputs_for("solve", (2,), 4, np.float64, rng) for _ in range(3)]
    bad = inputs_for("solve", (3,), 4, np.float64, rng)
    bad["A"][2] = 0.0  # its third matrix is singular
    options = dict(OPERATIONS["solve"].options)
    jobs = [
        ("solve", good[0], options),
        ("solve", bad, options),
        ("solve", good[1], options),
        ("solve", good[2], options),
    ]
    results = await run_gated(worker, jobs)
    assert isinstance(results[1], lu_core.SingularMatrixError)
    assert results[1].indices == [(2,)]
    for i in (0, 2, 3):
        assert_bit_identical(results[i], OPERATIONS["solve"].compute(jobs[i][1], options))


async def test_incompatible_jobs_run_in_order_and_all_answer(worker):
    rng = np.random.default_rng(2)
    jobs = []
    for i in range(12):
        op = ["lu_factor", "solve", "lu"][i % 3]
        n = [4, 4, 5, 6][i % 4]
        dtype = DTYPES[i % 4]
        jobs.append((op, inputs_for(op, (2,), n, dtype, rng), dict(OPERATIONS[op].options)))
    # Options differ: never merged together.
    jobs.append(("lu_factor", inputs_for("lu_factor", (), 4, np.float64, rng), {"pivot": False}))
    results = await run_gated(worker, jobs)
    for (name, tensors, opts), got in zip(jobs, results, strict=True):
        assert_bit_identical(got, OPERATIONS[name].compute(tensors, opts))


async def test_broadcasting_requests_run_alone(worker):
    rng = np.random.default_rng(3)
    LU, piv = lu_core.lu_factor(rand(rng, (4, 4), np.float64) + 4 * np.eye(4))
    jobs = [
        (
            "lu_solve",
            {"LU": LU, "pivots": piv, "B": rand(rng, (k, 4, 2), np.float64)},
            dict(OPERATIONS["lu_solve"].options),
        )
        for k in (1, 2, 3)
    ]
    before = batch_calls(worker.metrics)
    results = await run_gated(worker, jobs)
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == 3  # each alone
    for (name, tensors, opts), got in zip(jobs, results, strict=True):
        assert_bit_identical(got, OPERATIONS[name].compute(tensors, opts))


async def test_max_batch_and_element_bound(worker):
    rng = np.random.default_rng(4)
    worker._max_batch = 4
    jobs = [("lu_factor", inputs_for("lu_factor", (), 4, np.float64, rng), {"pivot": True}) for _ in range(10)]
    before = batch_calls(worker.metrics)
    await run_gated(worker, jobs)
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == 3  # 4 + 4 + 2
    worker._max_batch, worker._max_batch_elements = 64, 16 * 2
    before = after
    await run_gated(worker, jobs[:6])
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_count"] - before["lu_batch_size_count"] == 3  # two 4x4 matrices per call


async def test_cancelled_request_does_not_disturb_the_others(worker):
    rng = np.random.default_rng(5)
    options = dict(OPERATIONS["solve"].options)
    jobs = [("solve", inputs_for("solve", (2,), 4, np.float64, rng), options) for _ in range(4)]
    gate, holder = hold(worker)
    futures = [asyncio.ensure_future(worker.submit(n, OPERATIONS[n].compute, t, o)) for n, t, o in jobs]
    await asyncio.sleep(0.05)
    futures[1].cancel()
    gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    holder.join()
    assert isinstance(results[1], asyncio.CancelledError)
    for i in (0, 2, 3):
        assert_bit_identical(results[i], OPERATIONS["solve"].compute(jobs[i][1], options))


async def test_batching_through_http_answers_each_request(make_client):
    client = await make_client(max_batch=32)
    gate, holder = hold(client.app.state.worker)
    rng = np.random.default_rng(6)
    systems = [(rand(rng, (8, 8), np.float64) + 8 * np.eye(8), rand(rng, (8,), np.float64)) for _ in range(16)]
    bodies = [binary_request({"A": A, "B": B}) for A, B in systems]
    posts = [asyncio.ensure_future(client.post("/solve", content=b, headers=h)) for b, h in bodies]
    await asyncio.sleep(0.2)
    gate.set()
    responses = await asyncio.gather(*posts)
    holder.join()
    from tests.service.wire import parse_binary

    for (A, B), r in zip(systems, responses, strict=True):
        assert r.status_code == 200
        _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
        assert out["X"].tobytes() == lu_core.solve(A, B).tobytes()
    metrics = (await client.get("/metrics")).text
    count = next(float(x.split()[1]) for x in metrics.splitlines() if x.startswith("lu_batch_size_count"))
    assert count < 16  # merged into fewer calls than requests


async def test_jobs_submitted_in_one_pass_of_the_loop_reach_the_worker_together(worker):
    """No hold, no delay: requests the event loop handles in one pass are one hand-over, so one call."""
    rng = np.random.default_rng(8)
    options = dict(OPERATIONS["solve"].options)
    jobs = [inputs_for("solve", (), 8, np.float64, rng) for _ in range(8)]
    before = batch_calls(worker.metrics)
    results = await asyncio.gather(*(worker.submit("solve", OPERATIONS["solve"].compute, t, options) for t in jobs))
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == 1
    assert after["lu_batch_size_sum"] - before.get("lu_batch_size_sum", 0) == 8
    for tensors, got in zip(jobs, results, strict=True):
        assert_bit_identical(got, OPERATIONS["solve"].compute(tensors, options))
    assert worker.depth == 0
    worker._max_batch = 3  # a full batch is handed over at once, without waiting for the end of the pass
    before = after
    await asyncio.gather(*(worker.submit("solve", OPERATIONS["solve"].compute, t, options) for t in jobs))
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_count"] - before["lu_batch_size_count"] == 3  # 3 + 3 + 2


async def test_the_queue_bound_counts_jobs_not_hand_overs():
    metrics = Metrics("cpu", "test")
    worker = DeviceWorker(CpuDevice(), metrics, max_queue=3, retry_after_s=2, max_batch=64)
    worker.start()
    try:
        rng = np.random.default_rng(9)
        options = dict(OPERATIONS["solve"].options)
        jobs = [inputs_for("solve", (), 4, np.float64, rng) for _ in range(5)]
        gate, holder = hold(worker)
        submits = [worker.submit("solve", OPERATIONS["solve"].compute, t, options) for t in jobs]
        futures = [asyncio.ensure_future(s) for s in submits]
        await asyncio.sleep(0.05)
        assert worker.depth == 3
        gate.set()
        results = await asyncio.gather(*futures, return_exceptions=True)
        holder.join()
        refused = [r for r in results if isinstance(r, Exception)]
        assert len(refused) == 2 and all(r.status == 503 and r.headers["Retry-After"] == "2" for r in refused)
        assert all(isinstance(r, dict) for r in results[:3])
        assert worker.depth == 0
    finally:
        worker.stop(10)


async def test_worker_busy_and_cpu_time_are_counted(worker):
    def total(name: str) -> float:
        line = next(x for x in worker.metrics.render().decode().splitlines() if x.startswith(name + " "))
        return float(line.split()[1])

    before = total("lu_worker_busy_seconds_total"), total("lu_worker_cpu_seconds_total")
    rng = np.random.default_rng(10)
    options = dict(OPERATIONS["solve"].options)
    await worker.submit("solve", OPERATIONS["solve"].compute, inputs_for("solve", (), 64, np.float64, rng), options)
    after = total("lu_worker_busy_seconds_total"), total("lu_worker_cpu_seconds_total")
    assert after[0] > before[0] and after[1] > before[1]


def no_pinner():
    """A GpuDevice's body pinner that pins nothing (service.pinning; the stand-in device has no driver)."""
    from service.pinning import BodyPinner

    return BodyPinner(lambda ptr, n: None, lambda ptr: None, lambda n: False, lambda n: None)


class _FakeCupy:
    """Just enough of CuPy for GpuDevice._upload and PinnedStaging, counting host-to-device copies."""

    def __init__(self) -> None:
        self.copies: list[tuple[tuple[int, ...], bool]] = []  # (shape, from pinned staging)
        self.pinned: list[bytearray] = []
        fake = self

        class ndarray:  # CuPy's name
            def __init__(self, shape, dtype) -> None:
                self.shape, self.dtype, self.data = tuple(shape), np.dtype(dtype), None

            def set(self, host, stream=None) -> None:
                fake.copies.append((host.shape, any(np.shares_memory(host, np.frombuffer(b)) for b in fake.pinned)))
                self.data = host.copy()

        def asarray(a):
            fake.copies.append((a.shape, False))
            out = ndarray(a.shape, a.dtype)
            out.data = np.array(a)
            return out

        def alloc_pinned_memory(size: int) -> bytearray:
            fake.pinned.append(bytearray(size))
            return fake.pinned[-1]

        self.ndarray, self.asarray = ndarray, asarray
        self.empty = ndarray
        self.cuda = type("cuda", (), {"alloc_pinned_memory": staticmethod(alloc_pinned_memory)})


@pytest.mark.parametrize("n", [8, 64])  # staged through pinned memory only from PinnedStaging.MIN_BYTES
def test_gpu_stacked_batch_is_built_once_and_copied_in_once(n):
    """On a GPU the merged call's inputs are concatenated once, where they are uploaded from: one copy in each."""
    from service.device import GpuDevice, PinnedStaging, upload_parts

    cp = _FakeCupy()
    device = object.__new__(GpuDevice)  # no GPU here: the upload path with a stand-in for CuPy
    device._cp, device._staging, device._pinner = cp, PinnedStaging(cp, None), no_pinner()
    rng = np.random.default_rng(11)
    parts = [rand(rng, (k, n, n), np.float64) for k in (1, 3, 2, 1)]
    staged: list = []
    for _ in range(2):  # the second batch reuses the pinned buffer of the first
        cp.copies.clear()
        dev = device._upload(list(parts), None, staged)
        big = sum(p.nbytes for p in parts) >= PinnedStaging.MIN_BYTES
        assert cp.copies == [((7, n, n), big)]  # one copy in, of the whole stacked batch
        assert dev.data.tobytes() == np.concatenate(parts).tobytes()
        device._staging.release(staged)
        assert len(cp.pinned) == (1 if big else 0)
    # Single matrices (batcher._run_single: new_axis) take the same path: one copy of the stacked batch.
    singles = [rand(rng, (n, n), np.float64) for _ in range(5)]
    cp.copies.clear()
    dev = device._upload(upload_parts(singles, new_axis=True), None, staged)
    big = sum(p.nbytes for p in singles) >= PinnedStaging.MIN_BYTES
    assert cp.copies == [((5, n, n), big)]
    assert dev.data.tobytes() == np.stack(singles).tobytes()
    device._staging.release(staged)


async def test_every_job_lets_go_of_its_reservation_answered_cancelled_or_expired(worker):
    """A job holds its request's memory reservation until it is done: the worker hands the holds
    back with the answers (let go on the event loop), for merged, cancelled and expired jobs alike."""
    import time

    from service.budget import MemoryBudget

    rng = np.random.default_rng(9)
    budget = MemoryBudget(1 << 20)
    options = dict(OPERATIONS["solve"].options)
    jobs = [inputs_for("solve", (), 4, np.float64, rng) for _ in range(6)]
    reservations = [budget.reserve(1000) for _ in jobs]
    gate, holder = hold(worker)
    futures = [
        asyncio.ensure_future(
            worker.submit(
                "solve",
                OPERATIONS["solve"].compute,
                t,
                options,
                reservation=r,
                deadline=time.monotonic() - 1 if i == 4 else None,  # expired while queued: never computed
            )
        )
        for i, (t, r) in enumerate(zip(jobs, reservations, strict=True))
    ]
    await asyncio.sleep(0.05)
    assert budget.in_use == 6000  # each request's one reservation (the jobs' holds share it)
    for r in reservations[1:]:
        r.release()  # the requests let go (their clients left, say): the jobs' holds keep the bytes
    assert budget.in_use == 6000
    futures[1].cancel()
    gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    holder.join()
    assert isinstance(results[1], asyncio.CancelledError) and getattr(results[4], "status", None) == 408
    for i in (0, 2, 3, 5):
        assert_bit_identical(results[i], OPERATIONS["solve"].compute(jobs[i], options))
    for _ in range(100):  # the holds go back with the answers; the cancelled job's a moment later
        if budget.in_use == 1000:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    # Each job let go once: the first request, still holding its reservation, keeps its bytes.
    assert budget.in_use == 1000 and all(r.released for r in reservations[1:])
    reservations[0].release()
    assert budget.in_use == 0


def test_a_job_whose_event_loop_closed_still_lets_go_of_its_reservation():
    from service.budget import MemoryBudget

    metrics = Metrics("cpu", "test")
    w = DeviceWorker(CpuDevice(), metrics, max_queue=8, retry_after_s=1, max_batch=64)
    w.start()
    budget = MemoryBudget(1 << 20)
    reservation = budget.reserve(1000)
    loop = asyncio.new_event_loop()
    try:
        gate, holder = hold(w)
        task = loop.create_task(
            w.submit("det", OPERATIONS["det"].compute, {"A": np.eye(3)}, {}, reservation=reservation)
        )
        loop.run_until_complete(asyncio.sleep(0.05))  # submitted and handed over to the worker
        reservation.release()  # the request's own hold
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()  # torn down with the job queued: its answer cannot be delivered
    gate.set()
    holder.join()
    w.stop(10)
    assert budget.in_use == 0 and reservation.released


def test_jobs_of_two_event_loops_in_one_batch_are_answered_on_their_own_loops():
    """One merged call, answers handed to each job's own loop (and each hold let go there)."""
    from service.budget import MemoryBudget

    metrics = Metrics("cpu", "test")
    w = DeviceWorker(CpuDevice(), metrics, max_queue=64, retry_after_s=1, max_batch=64)
    w.start()
    options = dict(OPERATIONS["solve"].options)
    budget = MemoryBudget(1 << 20)
    results: dict[int, list] = {}
    submitted = threading.Barrier(3)
    gate, holder = hold(w)

    def client(k: int) -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            rng = np.random.default_rng(12 + k)
            jobs = [inputs_for("solve", (), 4, np.float64, rng) for _ in range(3)]
            holds = [budget.reserve(100) for _ in jobs]
            futures = [
                asyncio.ensure_future(w.submit("solve", OPERATIONS["solve"].compute, t, options, reservation=r))
                for t, r in zip(jobs, holds, strict=True)
            ]
            await asyncio.sleep(0.05)  # handed over to the worker
            await loop.run_in_executor(None, submitted.wait)
            answers = await asyncio.gather(*futures)
            for r in holds:
                r.release()
            results[k] = [(t, a, threading.get_ident()) for t, a in zip(jobs, answers, strict=True)]

        asyncio.run(main())

    threads = [threading.Thread(target=client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    submitted.wait()
    before = batch_calls(metrics)
    gate.set()
    for t in threads:
        t.join(30)
    holder.join()
    after = batch_calls(metrics)
    w.stop(10)
    assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == 1  # all six in one call
    for k in range(2):
        assert len(results[k]) == 3
        for t, answer, _ in results[k]:
            assert_bit_identical(answer, OPERATIONS["solve"].compute(t, options))
    assert budget.in_use == 0


def test_gather_keeps_arrival_order_and_never_reaches_past_a_call():
    """service.batcher.gather with a stand-in queue: what joins, what waits in pending (in order), and
    that no job runs ahead of a call (the warm-up, the stop) queued before it."""
    from collections import deque
    from queue import Empty
    from types import SimpleNamespace

    from service.batcher import gather, signature

    loop = asyncio.new_event_loop()
    try:
        A = {"A": np.eye(3), "B": np.ones((3, 1))}
        B = {"A": np.eye(4), "B": np.ones((4, 1))}  # another shape: never merged with A's

        def job(tensors, cancelled=False):
            future = loop.create_future()
            if cancelled:
                future.cancel()
            compute, options = OPERATIONS["solve"].compute, dict(OPERATIONS["solve"].options)
            return SimpleNamespace(
                name="solve", compute=compute, tensors=tensors, options=options, future=future,
                signature=signature("solve", compute, tensors, options),
            )  # fmt: skip

        a0, a1, b, x, a2, a3 = job(A), job(A), job(B), job(A, cancelled=True), job(A), job(A)
        call = object()
        arrivals = deque([[a1, b, x, a2], [call], [a3]])

        def take(timeout):
            if not arrivals:
                raise Empty
            return arrivals.popleft()

        def is_job(item):
            return isinstance(item, SimpleNamespace) and not item.future.cancelled()

        def is_barrier(item):
            return not isinstance(item, SimpleNamespace)

        pending: deque = deque()
        kw = dict(max_batch=8, max_elements=1 << 20, delay_s=0.0, is_job=is_job, is_barrier=is_barrier)
        assert gather(a0, take, pending, **kw) == [a0, a1, a2]  # a2 passes the cancelled x, not the call
        assert list(pending) == [b, x, call]
        assert list(arrivals) == [[a3]]  # behind the call: not taken
        first = pending.popleft()
        assert gather(first, take, pending, **kw) == [b]
        assert list(pending) == [x, call] and list(arrivals) == [[a3]]
        kw["max_batch"] = 2
        pending.extend([a3])
        arrivals.clear()
        assert gather(a0, take, pending, **kw) == [a0]  # x cancelled, then the call: a3 stays behind it
        assert list(pending) == [x, call, a3]
    finally:
        loop.close()


def test_on_a_gpu_only_jobs_our_kernels_compute_are_merged():
    """gpu_merges: merged only where lu_core's GPU routine is chosen from the matrix, not the batch."""
    from service.device import gpu_merges

    piv = np.arange(1, 9, dtype=np.int32)
    assert gpu_merges("solve", {"A": np.eye(32), "B": np.ones((32, 2))})
    assert gpu_merges("lu_factor", {"A": np.ones((3, 20, 32))}) and gpu_merges("lu", {"A": np.ones((5, 3))})
    assert gpu_merges("lu_solve", {"LU": np.eye(8), "pivots": piv, "B": np.ones((8, 500))})  # any nrhs
    assert gpu_merges("lu_unpack", {"LU": np.eye(8), "pivots": piv})
    assert gpu_merges("lu_unpack", {"LU": np.eye(100), "pivots": np.arange(1, 101, dtype=np.int32)})  # element-wise
    assert not gpu_merges("solve", {"A": np.eye(33), "B": np.ones(33)})  # cuBLAS / cuSOLVER by batch count
    assert not gpu_merges("lu_factor", {"A": np.ones((2, 40))})
    assert not gpu_merges("det", {"A": np.eye(4)}) and not gpu_merges("slogdet", {"A": np.eye(4)})


async def test_a_job_the_device_would_not_merge_runs_alone():
    class Picky(CpuDevice):
        def merges(self, name, tensors):
            return tensors["A"].shape[-1] <= 4

    metrics = Metrics("cpu", "test")
    w = DeviceWorker(Picky(), metrics, max_queue=64, retry_after_s=1, max_batch=64)
    w.metrics = metrics  # type: ignore[attr-defined]
    w.start()
    try:
        rng = np.random.default_rng(12)
        jobs = [
            (
                "solve",
                inputs_for("solve", (), 4 if i % 4 < 2 else 6, np.float64, rng),
                dict(OPERATIONS["solve"].options),
            )
            for i in range(8)
        ]
        results = await asyncio.wait_for(run_gated(w, jobs), 30)
        calls = batch_calls(metrics)
        assert (calls["lu_batch_size_count"], calls["lu_batch_size_sum"]) == (5, 8)  # the 4x4s merged, 6x6s alone
        for (name, tensors, opts), got in zip(jobs, results, strict=True):
            assert_bit_identical(got, OPERATIONS[name].compute(tensors, opts))
    finally:
        w.stop(10)


def test_gather_loses_nothing_when_it_fails():
    """A bug while gathering (here a key that raises for one job) leaves every item but the first back
    in pending, in arrival order, whatever had been taken, joined or set aside by then."""
    from collections import deque
    from queue import Empty

    from service import batcher

    items = [f"job{i}" for i in range(7)]
    arrivals = deque([items[2:4], items[4:7]])

    def take(timeout):
        if not arrivals:
            raise Empty
        return arrivals.popleft()

    def is_job(item):
        if item == "job5":
            raise RuntimeError("a bug")
        return True

    pending: deque = deque([items[1]])
    kw = dict(max_batch=8, max_elements=1 << 20, delay_s=0.0, is_job=is_job, is_barrier=lambda item: False)
    real = batcher.merge_key, batcher._elements
    batcher.merge_key, batcher._elements = (lambda job: ("same",)), (lambda job: 1)
    try:
        with pytest.raises(RuntimeError, match="a bug"):
            batcher.gather(
                type("First", (), {"signature": None})(), take, pending, **kw
            )  # job1..job4 joined, job5 raises
    finally:
        batcher.merge_key, batcher._elements = real
    assert list(pending) == items[1:] and not arrivals


async def test_a_bug_while_gathering_answers_every_request(worker, monkeypatch):
    """The worker survives a gathering that raises: the job it had runs alone, the jobs gathering had
    taken run next, and every request gets its own correct answer."""
    from service import batcher

    rng = np.random.default_rng(11)
    real = batcher.merge_key

    def merge_key(job):
        if job.tensors["A"].shape[-1] == 5:
            raise RuntimeError("a bug in merge_key")
        return real(job)

    monkeypatch.setattr(batcher, "merge_key", merge_key)
    jobs = [("solve", inputs_for("solve", (), 5 if i == 2 else 4, np.float64, rng), {}) for i in range(6)]
    jobs = [(name, tensors, dict(OPERATIONS[name].options)) for name, tensors, _ in jobs]
    results = await asyncio.wait_for(run_gated(worker, jobs), 30)  # (lost jobs would wait forever)
    for (name, tensors, opts), got in zip(jobs, results, strict=True):
        assert_bit_identical(got, OPERATIONS[name].compute(tensors, opts))
    assert worker._thread.is_alive()


async def test_jobs_handed_over_after_the_stop_are_answered():
    """A job submitted just before ``stop`` reaches the queue at the event loop's next pass, behind
    the stop: the worker finishes it before it ends (it used to end at the stop and leave it)."""
    import time

    metrics = Metrics("cpu", "test")
    w = DeviceWorker(CpuDevice(), metrics, max_queue=8, retry_after_s=1, max_batch=64)
    w.start()
    gate, holder = hold(w)
    A = {"A": np.eye(3), "B": np.ones((3, 1))}
    options = dict(OPERATIONS["solve"].options)
    answer = asyncio.ensure_future(w.submit("solve", OPERATIONS["solve"].compute, A, options))
    await asyncio.sleep(0)  # submitted: in this loop's outbox, handed over at its next pass
    stopper = threading.Thread(target=w.stop, args=(30,))
    stopper.start()
    while w._accepting:  # blocking on purpose: the loop must not run its next pass before the stop is queued
        time.sleep(0.001)
    time.sleep(0.05)
    gate.set()
    got = await asyncio.wait_for(answer, 10)
    assert_bit_identical(got, OPERATIONS["solve"].compute(A, options))
    await asyncio.to_thread(stopper.join, 30)
    holder.join()
    assert not w._thread.is_alive()


async def test_submit_interns_signatures_so_alike_jobs_share_one(monkeypatch):
    """Jobs of one kind (operation, options, shapes, dtypes) carry the very same signature object, so that
    gathering compares them by identity; another kind gets its own; the table stays bounded."""
    import service.worker as worker_module

    w = DeviceWorker(CpuDevice(), Metrics("cpu", "test"), max_queue=256, retry_after_s=1, max_batch=64)
    w._accepting = True  # not started: the jobs stay queued, to be looked at
    op = OPERATIONS["solve"]
    rng = np.random.default_rng(5)

    def tensors(n):
        return {"A": rng.standard_normal((n, n)), "B": rng.standard_normal((n, 1))}  # fresh arrays each time

    async def queued(sizes):
        tasks = [asyncio.ensure_future(w.submit("solve", op.compute, tensors(n), dict(op.options))) for n in sizes]
        for _ in range(3):
            await asyncio.sleep(0)  # the submits run, then the loop's next pass hands the outbox over
        jobs = [job for group in list(w._queue.queue) for job in group]
        w._queue.queue.clear()
        for t in tasks:
            t.cancel()
        return jobs

    a, b, c = await queued([4, 4, 5])
    assert a.signature is b.signature and a.tensors["A"] is not b.tensors["A"]
    assert c.signature is not a.signature and c.signature != a.signature

    monkeypatch.setattr(worker_module, "_MAX_SIGNATURES", 2)
    await queued([6, 7, 8, 9])
    assert len(w._signatures) <= 2


class _Connection:
    """Stands in for a request's ``service.protocol.BodySink``: ``lose()`` is the client hanging up."""

    def __init__(self) -> None:
        self.callback = None

    def on_lost(self, callback) -> None:
        self.callback = callback

    def lose(self) -> None:
        if self.callback is not None:
            self.callback()


async def test_jobs_of_clients_that_left_are_skipped_even_first_in_a_batch(worker):
    """The client of the queue's first job and of another one hang up while the worker is busy: their
    requests fail at once with ClientDisconnect, and the batch computed is the two others alone."""
    rng = np.random.default_rng(6)
    options = dict(OPERATIONS["solve"].options)
    jobs = [("solve", inputs_for("solve", (2,), 4, np.float64, rng), options) for _ in range(4)]
    connections = [_Connection() for _ in jobs]
    before = batch_calls(worker.metrics)
    gate, holder = hold(worker)
    futures = [
        asyncio.ensure_future(worker.submit(n, OPERATIONS[n].compute, t, o, connection=c))
        for (n, t, o), c in zip(jobs, connections, strict=True)
    ]
    await asyncio.sleep(0.05)
    connections[0].lose()
    connections[2].lose()
    await asyncio.sleep(0)
    assert futures[0].done() and futures[2].done()  # at once, while the worker is still held
    gate.set()
    results = await asyncio.gather(*futures, return_exceptions=True)
    holder.join()
    assert isinstance(results[0], ClientDisconnect) and isinstance(results[2], ClientDisconnect)
    for i in (1, 3):
        assert_bit_identical(results[i], OPERATIONS["solve"].compute(jobs[i][1], options))
    after = batch_calls(worker.metrics)
    assert after["lu_batch_size_sum"] - before.get("lu_batch_size_sum", 0) == 2  # one call, of the two live jobs
    assert after["lu_batch_size_count"] - before.get("lu_batch_size_count", 0) == 1
    assert all(c.callback is None for c in connections)  # every watch unset
