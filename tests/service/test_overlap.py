"""The worker on a device that overlaps (a GPU): the next job's inputs go up before the last one's answer
is collected, a lone job is collected at once, failures stay per request, memory and barriers are respected.

The device here is the CPU with a recording ``launch``: a job is started in the GPU's three steps
(``launch``: the upload queued; ``compute()``; ``result()``: the download, waited for), and each step is
recorded, so the tests check the worker's order of calls, which is the same on a GPU.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import weakref

import numpy as np
import pytest

from service.device import CpuDevice, Launched
from service.errors import ServiceError
from service.metrics import Metrics
from service.operations import OPERATIONS
from service.worker import DeviceWorker
from tests.service.test_batching import _FakeCupy, no_pinner

SOLVE = OPERATIONS["solve"]


def _tensors(tag: float) -> dict[str, np.ndarray]:
    return {"A": np.eye(2) * 2.0, "B": np.full(2, tag)}


def _tags(tensors) -> list[float]:
    """The distinct values of B, which name this file's jobs (none for other operations)."""
    return sorted({float(x) for x in np.asarray(tensors.get("B", [])).ravel()})


class _Stepped(Launched):
    """A job in three recorded steps; computed (on the CPU) in compute(), as a GPU would."""

    def __init__(self, device: OverlappingDevice, tags: list[float], answer_of) -> None:
        super().__init__({})
        self.device, self.tags, self.answer_of = device, tags, answer_of

    def compute(self) -> None:
        self.device.events.append(("compute", self.tags))
        self._answer = self.answer_of()  # raises what lu_core raises (a singular system)

    def result(self) -> dict:
        self.device.events.append(("result", self.tags))
        if self.tags == self.device.fail_result:
            raise RuntimeError("lost on the way back")
        return super().result()


class OverlappingDevice(CpuDevice):
    """Records when each job's inputs are uploaded (launch), when it is computed and when collected."""

    overlaps = True

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, list[float]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.launching = threading.Event()
        self.fail_result: list[float] | None = None  # the tags of the call whose collect fails
        self.out_of_memory = 0  # how many uploads after job 1's compute fail with MemoryError

    def _launched(self, tags: list[float], answer_of) -> _Stepped:
        self.launching.set()
        self.gate.wait(10)
        if self.out_of_memory and ("compute", [1.0]) in self.events:
            self.out_of_memory -= 1  # the uploads after job 1's: beside it in flight, then the retry
            self.events.append(("out of memory", tags))
            raise MemoryError("no room beside the job in flight")  # what CuPy's pool raises
        self.events.append(("upload", tags))
        return _Stepped(self, tags, answer_of)

    def launch(self, compute, tensors, options):
        return self._launched(_tags(tensors), lambda: self.run(compute, tensors, options))

    def launch_stacked(self, compute, parts, options, *, new_axis=False):
        tags = sorted({t for p in parts.get("B", []) for t in _tags({"B": p})})
        return self._launched(tags, lambda: self.run_stacked(compute, parts, options, new_axis=new_axis))


def _scenario(device: OverlappingDevice, body, *, max_batch: int = 1) -> None:
    async def main() -> None:
        worker = DeviceWorker(device, Metrics("cpu", "test"), max_queue=16, retry_after_s=1, max_batch=max_batch)
        worker.start()
        try:
            await body(worker)
        finally:
            await asyncio.to_thread(worker.stop, 10)

    asyncio.run(main())


def _assert_halves(answers: list[dict], tags: list[float]) -> None:
    """Each job of this file solves 2 X = B with B full of its tag: X is the tag halved."""
    assert len(answers) == len(tags)
    for tag, answer in zip(tags, answers, strict=True):
        np.testing.assert_array_equal(answer["X"], np.full(2, tag / 2))


def _submit(worker: DeviceWorker, tag: float) -> asyncio.Future:
    return asyncio.ensure_future(worker.submit("solve", SOLVE.compute, _tensors(tag), dict(SOLVE.options)))


async def _hold_first(device: OverlappingDevice, worker: DeviceWorker, tags: list[float]) -> list[asyncio.Future]:
    """The first job blocks in its launch until the others are queued."""
    device.gate.clear()
    first = _submit(worker, tags[0])
    await asyncio.to_thread(device.launching.wait, 10)
    rest = [_submit(worker, t) for t in tags[1:]]
    while worker.depth < len(rest):
        await asyncio.sleep(0.005)
    device.gate.set()
    return [first, *rest]


def test_the_next_jobs_upload_is_queued_before_the_last_ones_answer_is_collected():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0])
        _assert_halves(await asyncio.wait_for(asyncio.gather(*futures), 10), [1.0, 2.0, 3.0])

    _scenario(device, body)
    # Each job: upload queued, the job in flight collected meanwhile, then computed; the last one is
    # collected as soon as nothing else is queued.
    assert device.events == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("upload", [2.0]),
        ("result", [1.0]),
        ("compute", [2.0]),
        ("upload", [3.0]),
        ("result", [2.0]),
        ("compute", [3.0]),
        ("result", [3.0]),
    ]


def test_a_lone_job_is_collected_at_once():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        for tag in (1.0, 2.0):  # one at a time: the worker must not hold an answer waiting for a next job
            _assert_halves([await asyncio.wait_for(_submit(worker, tag), 5)], [tag])

    _scenario(device, body)
    assert device.events == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("result", [1.0]),
        ("upload", [2.0]),
        ("compute", [2.0]),
        ("result", [2.0]),
    ]


def _note_answers(futures: list[asyncio.Future], tags: list[float], answered: list[float]) -> None:
    """Append each job's tag to ``answered`` when its answer comes (the order the worker handed them back)."""
    for tag, future in zip(tags, futures, strict=True):
        future.add_done_callback(lambda _, tag=tag: answered.append(tag))


class HostAndDevice(OverlappingDevice):
    """A GPU whose jobs tagged in ``on_host`` are small enough for the host (LU_GPU_HOST_MAX_N): computed
    whole (``run``, recorded), not started in steps."""

    def __init__(self, on_host: set[float]) -> None:
        super().__init__()
        self.on_host = on_host

    def overlapped(self, compute, tensors) -> bool:
        return not set(_tags(tensors)) <= self.on_host

    def run(self, compute, tensors, options):
        if set(_tags(tensors)) <= self.on_host:
            self.events.append(("host", _tags(tensors)))
        return super().run(compute, tensors, options)


def test_a_job_computed_on_the_host_is_answered_at_once_and_the_job_in_flight_lands_after_it():
    """2 and 3 on the host while 1 is in flight on the device: each is answered when computed (not held
    for the next job's upload, as a job started in steps is), and 1 lands right after 2, not behind
    every host job queued; 4 on the device again overlaps as before."""
    device = HostAndDevice({2.0, 3.0})
    answered: list[float] = []

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0, 4.0])
        _note_answers(futures, [1.0, 2.0, 3.0, 4.0], answered)
        _assert_halves(await asyncio.wait_for(asyncio.gather(*futures), 10), [1.0, 2.0, 3.0, 4.0])

    _scenario(device, body)
    assert device.events == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("host", [2.0]),
        ("result", [1.0]),
        ("host", [3.0]),
        ("upload", [4.0]),
        ("compute", [4.0]),
        ("result", [4.0]),
    ]
    assert answered == [2.0, 1.0, 3.0, 4.0]


def test_host_jobs_merged_beside_a_job_in_flight_are_answered_first_and_a_failing_one_alone():
    """2 and 3 merged into one host call while 1 is in flight: answered before 1 lands; then 4 and 5 on
    the host, 4 singular (check_errors): the merged call fails, each is answered alone (4 its error),
    and nothing is left in flight or unanswered."""
    device = HostAndDevice({2.0, 3.0, 4.0, 5.0})
    answered: list[float] = []

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0])
        _note_answers(futures, [1.0, 2.0, 3.0], answered)
        _assert_halves(await asyncio.wait_for(asyncio.gather(*futures), 10), [1.0, 2.0, 3.0])
        singular = {"A": np.zeros((2, 2)), "B": np.full(2, 4.0)}
        options = {**SOLVE.options, "check_errors": True}
        bad = asyncio.ensure_future(worker.submit("solve", SOLVE.compute, singular, options))
        good = _submit(worker, 5.0)
        results = await asyncio.wait_for(asyncio.gather(bad, good, return_exceptions=True), 10)
        assert isinstance(results[0], Exception) and "singular" in str(results[0]).lower()
        _assert_halves([results[1]], [5.0])

    _scenario(device, body, max_batch=8)
    assert device.events[:7] == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("upload", [2.0, 3.0]),  # the stand-in records a merged call's steps; on a GPU: one _HostJob
        ("compute", [2.0, 3.0]),
        ("host", [2.0, 3.0]),
        ("result", [2.0, 3.0]),
        ("result", [1.0]),
    ]
    assert answered == [2.0, 3.0, 1.0]


def test_merged_calls_overlap_too_and_a_failed_collect_answers_each_job_alone():
    device = OverlappingDevice()
    device.fail_result = [2.0, 3.0]

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0])
        _assert_halves(await asyncio.wait_for(asyncio.gather(*futures), 10), [1.0, 2.0, 3.0])

    _scenario(device, body, max_batch=8)
    # 1 alone (taken before the others were queued), then 2 and 3 merged, uploaded before 1's answer
    # is collected; their collect fails, so each is computed again alone (device.run) and answered.
    assert device.events == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("upload", [2.0, 3.0]),
        ("result", [1.0]),
        ("compute", [2.0, 3.0]),
        ("result", [2.0, 3.0]),
    ]


def test_a_failed_collect_of_one_job_is_that_requests_error():
    device = OverlappingDevice()
    device.fail_result = [1.0]

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        first, second = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
        assert isinstance(first, RuntimeError) and "lost on the way back" in str(first)
        np.testing.assert_array_equal(second["X"], np.full(2, 1.0))

    _scenario(device, body)


def _compute_calls(metrics: Metrics) -> float:
    """lu_compute_seconds' count, all operations and devices."""
    return sum(s.value for s in metrics.compute_seconds.collect()[0].samples if s.name.endswith("_count"))


# (On the CPU a job is collected within its compute: no collect of its own to fail.)
@pytest.mark.parametrize(("overlaps", "where"), [(False, "compute"), (True, "compute"), (True, "collect")])
def test_a_lone_job_that_fails_counts_its_compute_time(overlaps, where):
    """lu_compute_seconds counts every call a request made, answered or not, on both of the worker's
    paths (a job that fails in compute: a singular system; one whose collect fails: the GPU's download)."""
    device = OverlappingDevice() if overlaps else CpuDevice()
    if where == "collect":
        device.fail_result = [1.0]
    tensors = {"A": np.zeros((2, 2)), "B": np.ones(2)} if where == "compute" else _tensors(1.0)
    metrics = Metrics("cpu", "test")

    async def main() -> None:
        worker = DeviceWorker(device, metrics, max_queue=16, retry_after_s=1)
        worker.start()
        try:
            done = worker.submit("solve", SOLVE.compute, tensors, dict(SOLVE.options))
            (error,) = await asyncio.wait_for(asyncio.gather(done, return_exceptions=True), 10)
        finally:
            await asyncio.to_thread(worker.stop, 10)
        assert type(error).__name__ == ("SingularMatrixError" if where == "compute" else "RuntimeError")

    asyncio.run(main())
    assert _compute_calls(metrics) == 1


def test_an_error_in_compute_is_that_requests_alone():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        singular = asyncio.ensure_future(
            worker.submit("solve", SOLVE.compute, {"A": np.zeros((2, 2)), "B": np.ones(2)}, dict(SOLVE.options))
        )
        done = await asyncio.wait_for(asyncio.gather(*futures, singular, return_exceptions=True), 10)
        assert [float(d["X"][0]) for d in done[:2]] == [0.5, 1.0]
        assert type(done[2]).__name__ == "SingularMatrixError"

    _scenario(device, body)


def test_out_of_memory_beside_a_job_in_flight_waits_for_it_and_retries():
    device = OverlappingDevice()
    device.out_of_memory = 1

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert [float(a["X"][0]) for a in answers] == [0.5, 1.0]

    _scenario(device, body)
    assert device.events == [
        ("upload", [1.0]),
        ("compute", [1.0]),
        ("out of memory", [2.0]),
        ("result", [1.0]),
        ("upload", [2.0]),
        ("compute", [2.0]),
        ("result", [2.0]),
    ]


def test_out_of_memory_again_after_the_retry_is_one_503_counted_once():
    device = OverlappingDevice()
    device.out_of_memory = 2
    metrics = Metrics("cpu", "test")
    released: list[bool] = []
    device.release_memory = lambda: released.append(True)

    async def main() -> None:
        worker = DeviceWorker(device, metrics, max_queue=16, retry_after_s=3)
        worker.start()
        try:
            futures = await _hold_first(device, worker, [1.0, 2.0])
            first, second = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
        finally:
            await asyncio.to_thread(worker.stop, 10)
        np.testing.assert_array_equal(first["X"], np.full(2, 0.5))
        assert second.status == 503 and second.code == "device_out_of_memory"

    asyncio.run(main())
    assert [e[0] for e in device.events] == ["upload", "compute", "out of memory", "result", "out of memory"]
    assert released == [True]  # the pool released once, for the one failure answered
    counted = metrics.rejected.labels("device_out_of_memory")._value.get()
    assert counted == 1


def test_a_call_waits_for_the_job_in_flight():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        device.gate.clear()
        first = _submit(worker, 1.0)
        await asyncio.to_thread(device.launching.wait, 10)
        # Queued while the first job's upload is held: the call reaches the worker with that job in flight.
        called = asyncio.ensure_future(asyncio.to_thread(worker.call, lambda: device.events.append(("call", []))))
        while worker._queue.empty():
            await asyncio.sleep(0.005)
        device.gate.set()
        await asyncio.wait_for(asyncio.gather(first, called), 10)

    _scenario(device, body)
    assert device.events == [("upload", [1.0]), ("compute", [1.0]), ("result", [1.0]), ("call", [])]


@pytest.mark.parametrize("max_batch", [1, 8])  # 1: batches of expired or cancelled jobs alone, behind one in flight
def test_expired_and_cancelled_jobs_beside_a_job_in_flight_are_answered_and_let_go_once(max_batch):
    """A merged batch holding a live job, a job whose deadline passed and one whose client left, behind a
    job in flight: each answered once (200, 408, nothing), every request's memory hold let go once."""
    import time

    from service.budget import MemoryBudget

    device = OverlappingDevice()
    budget = MemoryBudget(1 << 20)

    problems: list[dict] = []

    async def body(worker: DeviceWorker) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context))
        device.gate.clear()
        reservations = [budget.reserve(1000) for _ in range(4)]
        opts = dict(SOLVE.options)

        def submit(tag: float, reservation, deadline=None) -> asyncio.Future:
            call = worker.submit(
                "solve", SOLVE.compute, _tensors(tag), opts, reservation=reservation, deadline=deadline
            )
            return asyncio.ensure_future(call)

        first = submit(1.0, reservations[0])
        await asyncio.to_thread(device.launching.wait, 10)
        live = submit(2.0, reservations[1])
        expired = submit(3.0, reservations[2], deadline=time.monotonic() - 1)
        gone = submit(4.0, reservations[3])
        while worker.depth < 3:
            await asyncio.sleep(0.005)
        gone.cancel()
        device.gate.set()
        done = await asyncio.wait_for(asyncio.gather(first, live, expired, return_exceptions=True), 10)
        assert float(done[0]["X"][0]) == 0.5 and float(done[1]["X"][0]) == 1.0
        assert getattr(done[2], "status", None) == 408
        await asyncio.sleep(0.05)  # the holds are let go on the loop, after the answers
        assert budget.in_use == 4000  # each job let go of its hold once: the requests' own remain
        for r in reservations:
            r.release()
        assert budget.in_use == 0
        assert problems == []  # no future answered twice (set_result on a done future fails in a callback)

    _scenario(device, body, max_batch=max_batch)
    assert [e for e in device.events if e[1] == [4.0]] == []  # never computed


def test_an_answer_is_not_held_while_the_worker_waits_for_a_batch():
    """With LU_BATCH_DELAY_US the worker may wait for more jobs to merge: the job in flight is collected first."""
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        started = asyncio.get_running_loop().time()
        first = await asyncio.wait_for(futures[0], 10)
        assert asyncio.get_running_loop().time() - started < 0.4  # not after the 0.5 s gathering window
        np.testing.assert_array_equal(first["X"], np.full(2, 0.5))
        await asyncio.wait_for(futures[1], 10)

    async def main() -> None:
        worker = DeviceWorker(
            device, Metrics("cpu", "test"), max_queue=16, retry_after_s=1, max_batch=8, batch_delay_us=500_000
        )
        worker.start()
        try:
            await body(worker)
        finally:
            await asyncio.to_thread(worker.stop, 10)

    asyncio.run(main())


@pytest.mark.parametrize("overlaps", [False, True])
def test_merged_answers_split_alike_whether_collected_at_once_or_later(overlaps, rng):
    device = OverlappingDevice()
    device.overlaps = overlaps
    systems = [(rng.standard_normal((5, 5)), rng.standard_normal((5, 3))) for _ in range(12)]

    async def body(worker: DeviceWorker) -> None:
        futures = [
            asyncio.ensure_future(worker.submit("solve", SOLVE.compute, {"A": A, "B": B}, dict(SOLVE.options)))
            for A, B in systems
        ]
        for (A, B), answer in zip(systems, await asyncio.gather(*futures), strict=True):
            np.testing.assert_array_equal(
                answer["X"], OPERATIONS["solve"].compute({"A": A, "B": B}, SOLVE.options)["X"]
            )

    _scenario(device, body, max_batch=4)


@pytest.mark.gpu
@pytest.mark.parametrize("max_batch", [1, 8])
def test_on_a_gpu_overlapped_jobs_answer_what_each_job_alone_does(rng, max_batch):
    """Jobs queued together, so that each one's upload runs while the last one's answer comes back: every
    answer equals, bit for bit, the same job run alone on the same device. Runs of equal sizes, so that a
    freed block is what the next upload gets (an input freed while the compute stream still read it, a
    staging buffer handed out during its copy would show here); big ones staged in pinned memory, small
    ones copied from pageable memory; with max_batch 8 the equal jobs are merged as well.
    """
    from service.device import GpuDevice

    device = GpuDevice(0)
    ops = OPERATIONS
    jobs = []
    # Merged (max_batch 8): sizes our own kernels take at any batch (n <= 32), which the GPU merges; 48 it
    # runs alone (above 32, cuSOLVER or cuBLAS is chosen from the batch count: service.device.gpu_merges).
    sizes, batch = ((4, 48, 300, 700), 3) if max_batch == 1 else ((4, 24, 32, 48), 40)
    for n in sizes:
        for k in range(6):
            A = rng.standard_normal((batch, n, n)) + n * np.eye(n)
            name = ("solve", "lu_factor", "lu_unpack", "lu_solve")[k % 4] if max_batch == 1 else "solve"
            if name in ("lu_unpack", "lu_solve"):
                factored = ops["lu_factor"].compute({"A": A}, {"pivot": True})
                tensors = {"LU": factored["LU"], "pivots": factored["pivots"]}
                if name == "lu_solve":
                    tensors["B"] = rng.standard_normal((batch, n, 2))
            elif name == "lu_factor":
                tensors = {"A": A}
            else:
                tensors = {"A": A, "B": rng.standard_normal((batch, n, 2))}
            jobs.append((name, tensors))

    async def body(worker: DeviceWorker) -> None:
        futures = [
            asyncio.ensure_future(worker.submit(name, ops[name].compute, tensors, dict(ops[name].options)))
            for name, tensors in jobs
        ]
        overlapped = await asyncio.wait_for(asyncio.gather(*futures), 300)
        alone = [
            await asyncio.to_thread(
                worker.call, lambda n=name, t=tensors: device.run(ops[n].compute, t, ops[n].options)
            )
            for name, tensors in jobs
        ]
        for got, want in zip(overlapped, alone, strict=True):
            assert got.keys() == want.keys()
            for key in want:
                np.testing.assert_array_equal(got[key], want[key])

    async def main() -> None:
        worker = DeviceWorker(device, Metrics("gpu", "test"), max_queue=64, retry_after_s=1, max_batch=max_batch)
        worker.start()
        try:
            await body(worker)
        finally:
            await asyncio.to_thread(worker.stop, 30)

    asyncio.run(main())


class _StreamingCupy(_FakeCupy):
    """The CuPy stand-in of test_batching, with the streams, events and downloads GpuDevice's launch uses."""

    def __init__(self) -> None:
        super().__init__()

        class Stream:
            def __enter__(self):
                return self

            def __exit__(self, *exc) -> None:
                pass

            def wait_event(self, event) -> None:
                pass

            def synchronize(self) -> None:
                pass

        fake = self

        class Event:
            def record(self, stream=None) -> None:
                pass

            def synchronize(self) -> None:  # the queued downloads happen now: their sources must be alive
                for source, mem, size in fake.pending:
                    assert source() is not None, "a download's device source was freed before it completed"
                    ctypes.memmove(mem.value, source().data.host.ctypes.data, size)
                fake.pending.clear()

        class OutOfMemoryError(MemoryError):
            pass

        self.Stream = Stream
        self.cuda.Event = Event
        self.cuda.get_elapsed_time = staticmethod(lambda start, end: 0.0)
        self.cuda.memory = type("memory", (), {"OutOfMemoryError": OutOfMemoryError})
        self.asnumpy = lambda a, stream=None: np.array(a.data)
        self.downloads: list[bool] = []  # per download: into pinned memory (copy_to_host_async) or not
        self.pending: list = []  # queued downloads: (weakref to the device source, pointer, size)

        class DevicePointer:  # MemoryPointer's copy out, for a C-contiguous stand-in array
            def __init__(self, host, owner) -> None:
                self.host, self.owner = host, owner

            def copy_to_host_async(self, mem, size, stream=None) -> None:
                assert size == self.host.nbytes and any(
                    ctypes.addressof(ctypes.c_char.from_buffer(b)) <= mem.value < ctypes.addressof(
                        ctypes.c_char.from_buffer(b)) + len(b) for b in fake.pinned
                ), "copy_to_host_async needs pinned memory"  # fmt: skip
                fake.downloads.append(True)
                fake.pending.append((self.owner, mem, size))  # done at the next Event.synchronize

        def ascontiguousarray(a):
            out = self.ndarray(a.shape, a.dtype)
            out.data = DevicePointer(np.ascontiguousarray(a.data), weakref.ref(out))
            return out

        def asnumpy(a, stream=None):
            fake.downloads.append(False)
            return np.array(a.data)

        self.ascontiguousarray, self.asnumpy = ascontiguousarray, asnumpy


def test_a_gpu_job_keeps_its_inputs_and_staging_buffers_until_its_result_is_collected():
    """GpuDevice.launch with a stand-in for CuPy: between launch and result() the job's device inputs stay
    referenced (CuPy's pool would hand a freed block to the next upload on the same stream while the compute
    still reads it) and its pinned staging buffer stays out of the free list (the next job's upload must not
    be staged into it); result() gives both back. On a device: test_on_a_gpu_overlapped_jobs_... above."""
    import gc
    import weakref

    from service.device import GpuDevice, PinnedStaging

    cp = _StreamingCupy()
    device = object.__new__(GpuDevice)
    device._cp, device._staging, device.metrics, device._stage_children = cp, PinnedStaging(cp, None), None, {}
    device._pinner = no_pinner()
    device._streams = (cp.Stream(), cp.Stream(), cp.Stream())
    seen: list[weakref.ref] = []

    def compute(tensors, options):
        seen.append(weakref.ref(tensors["A"]))
        return {"X": cp.asarray(tensors["A"].data * 2)}

    big = np.ones((4, 64, 64))  # 128 KiB: staged through pinned memory, and downloaded into it
    first = device.launch(compute, {"A": big}, {})
    first.compute()
    second = device.launch(compute, {"A": big * 3}, {})  # uploaded while the first is in flight
    assert len(cp.pinned) == 2  # the second job was not staged into the first one's buffer
    second.compute()
    gc.collect()
    assert seen[0]() is not None and seen[1]() is not None  # both jobs' inputs still referenced
    np.testing.assert_array_equal(first.result()["X"], big * 2)
    del first
    gc.collect()
    assert seen[0]() is None and seen[1]() is not None  # the first job's inputs went with its result
    third = device.launch(compute, {"A": big * 5}, {})
    # Staged into a free buffer: the first job's staging buffer, or the one its answer was downloaded
    # into (a third buffer, back in the free list once that answer was dropped).
    assert len(cp.pinned) == 3
    np.testing.assert_array_equal(second.result()["X"], big * 6)
    third.compute()
    np.testing.assert_array_equal(third.result()["X"], big * 10)
    with pytest.raises(RuntimeError, match="collected once"):
        third.result()
    assert len(cp.pinned) == 3 and cp.downloads == [True] * 3  # every answer came down into pinned memory
    assert device._staging.idle() == 3  # all three buffers free
    # A result asked before compute() is refused, and the job's staging buffer goes back all the same.
    early = device.launch(compute, {"A": big}, {})
    with pytest.raises(RuntimeError, match="after compute"):
        early.result()
    assert device._staging.idle() == 3
    # The merged path outside the worker (run_stacked) takes the same steps.
    stacked = device.run_stacked(compute, {"A": [big, big * 2]}, {})
    np.testing.assert_array_equal(stacked["X"], np.concatenate([big, big * 2]) * 2)
    del stacked
    gc.collect()
    assert device._staging.idle() == 5  # the merged call's staging and download buffers (larger) as well
    assert device._staging.held_bytes == sum(size * len(bufs) for size, bufs in device._staging._free.items())


def test_gpu_answers_come_down_into_pinned_buffers_that_return_when_the_answer_is_gone():
    """result() copies a large output into a leased pinned buffer (a pageable copy was 2.4 GB/s for
    512 MiB on the first H200), which goes back to the staging pool only once the answer and every
    view of it are dropped (the response written); past the pinned cap, and for small outputs, the
    copy goes to pageable memory: bounded, never refused."""
    import gc

    from service.device import GpuDevice, PinnedStaging

    cp = _StreamingCupy()
    device = object.__new__(GpuDevice)
    device._cp, device.metrics, device._stage_children = cp, None, {}
    device._staging = PinnedStaging(cp, 3 << 17)  # room for three 128 KiB buffers
    device._pinner = no_pinner()
    device._streams = (cp.Stream(), cp.Stream(), cp.Stream())

    def compute(tensors, options):
        return {"X": cp.asarray(tensors["A"].data.T * 2)}  # a transposed (not C-ordered) output

    small, big = np.ones((2, 4, 4)), np.arange(4 * 64 * 64, dtype=np.float64).reshape(4, 64, 64)
    held = device.run(compute, {"A": big}, {})["X"]
    np.testing.assert_array_equal(held, big.T * 2)
    assert held.flags.c_contiguous and cp.downloads == [True]
    assert any(np.shares_memory(held, np.frombuffer(b, np.uint8)) for b in cp.pinned)
    view = held[1:]
    del held
    gc.collect()
    assert device._staging.held_bytes == 2 << 17 and device._staging.idle() == 1
    # The cap: each job's upload takes the free staging buffer back; the second answer held at once takes
    # the third buffer the cap allows, the third answer goes to pageable memory.
    second = device.run(compute, {"A": big}, {})["X"]
    third = device.run(compute, {"A": big}, {})["X"]
    assert cp.downloads[1:] == [True, False] and device._staging.held_bytes == 3 << 17
    np.testing.assert_array_equal(third, big.T * 2)
    assert device.run(compute, {"A": small}, {})["X"].shape == (4, 4, 2) and cp.downloads[-1] is False
    del view, second, third
    gc.collect()
    assert device._staging.idle() == 3  # all back, none lost


def test_a_gpu_starts_in_steps_only_the_jobs_it_computes():
    """GpuDevice.overlapped: host-sized jobs (LU_GPU_HOST_MAX_N) are computed whole; LU_GPU_HOST_MAX_N=0 or
    a larger matrix: started in steps, as before."""
    from service.device import GpuDevice

    device = object.__new__(GpuDevice)  # no GPU here: the rule only
    solve = OPERATIONS["solve"].compute
    small = {"A": np.eye(8), "B": np.ones((8, 1))}
    device.host_max_n = 32
    assert not device.overlapped(solve, small)
    assert device.overlapped(solve, {"A": np.eye(33), "B": np.ones((33, 1))})
    device.host_max_n = 0
    assert device.overlapped(solve, small)


def test_host_sized_jobs_follow_the_matrix_order_only():
    from service.device import HOST_MAX_WORK, host_sized

    small, big = np.ones((1000, 8, 8)), np.ones((1, 33, 33))
    assert host_sized("solve", {"A": small, "B": np.ones((1000, 8, 1))}, 32)
    assert host_sized("lu_unpack", {"LU": np.ones((2, 32, 20)), "pivots": np.ones((2, 20), np.int32)}, 32)
    assert host_sized("lu_factor", {"A": [small[:3], small[3:]]}, 32)  # the parts of a merged batch
    assert not host_sized("solve", {"A": big, "B": np.ones((1, 33, 1))}, 32)
    many = np.ones((HOST_MAX_WORK // 512 + 1, 8, 8))  # small matrices, but more work than a round trip
    assert not host_sized("lu_factor", {"A": many}, 32) and not host_sized("lu_factor", {"A": [many, many]}, 32)
    assert host_sized("lu_factor", {"A": many[:-1]}, 32)
    # A small (or broadcast) A with a huge B: the right-hand sides' work counts too.
    assert not host_sized("solve", {"A": np.ones((8, 8)), "B": np.ones((HOST_MAX_WORK // 64 + 1, 8, 1))}, 32)
    assert not host_sized("lu_solve", {"LU": np.ones((1, 32, 32)), "pivots": np.ones((1, 32), np.int32),
                                       "B": np.ones((1, 32, HOST_MAX_WORK // 1024 + 1))}, 32)  # fmt: skip
    assert host_sized("solve", {"A": np.ones((8, 8)), "B": np.ones((1000, 8, 1))}, 32)
    assert not host_sized("lu_factor", {"A": np.ones((2, 8, 40))}, 32)  # both dimensions count
    assert not host_sized("solve", {"A": small, "B": small}, 0)  # 0: everything on the GPU
    assert not host_sized("solve_refined", {"A": small, "B": small}, 32)  # not a stateless core operation
    assert not host_sized("lu_solve", {"LU": object(), "pivots": np.ones((1, 8), np.int32)}, 32)  # on the device
    assert not host_sized("lu_solve", {"LU": small, "pivots": object(), "B": small}, 32)


def test_a_gpu_service_computes_small_matrices_on_the_host_and_large_ones_on_the_device():
    """LU_GPU_HOST_MAX_N: an 8x8 solve never touches the device (no upload, no download: lu_core's CPU
    backend on the worker thread); a 40x40 one goes up, computes and comes down; merged parts of small
    matrices are joined on the host; and the merge rule follows (the CPU's: always, for small ones)."""
    from service.device import GpuDevice, PinnedStaging, operation_name
    from service.operations import OPERATIONS

    cp = _StreamingCupy()
    device = object.__new__(GpuDevice)
    device._cp, device.metrics, device._stage_children = cp, Metrics("gpu", "test"), {}
    device._staging, device.host_max_n = PinnedStaging(cp, None), 32
    device._pinner = no_pinner()
    device._streams = (cp.Stream(), cp.Stream(), cp.Stream())
    solve = OPERATIONS["solve"].compute
    assert operation_name(solve) == "solve"
    rng = np.random.default_rng(4)
    A = rng.standard_normal((3, 8, 8)) + 8 * np.eye(8)
    B = rng.standard_normal((3, 8, 2))
    X = device.run(solve, {"A": A, "B": B}, dict(OPERATIONS["solve"].options))["X"]
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-12)
    assert isinstance(X, np.ndarray) and cp.copies == [] and cp.downloads == []  # never on the device
    timed = device.metrics.device_seconds.labels("solve", "host", "gpu")._sum.get()  # its own stage, host
    assert timed > 0 and device.metrics.device_seconds.labels("solve", "compute", "gpu")._sum.get() == 0
    # A 503 the host path already raised is not taken for a new out-of-memory error (no second release).
    assert not device.is_out_of_memory(ServiceError(503, "device_out_of_memory", "out of memory"))
    merged = device.launch_stacked(solve, {"A": [A[:1], A[1:]], "B": [B[:1], B[1:]]}, dict(OPERATIONS["solve"].options))
    merged.compute()
    np.testing.assert_array_equal(merged.result()["X"], X)
    assert cp.copies == [] and device.merges("solve", {"A": A, "B": B})
    big = rng.standard_normal((1, 40, 40))
    calls: list[bool] = []

    def on_device(tensors, options):  # a stand-in compute: records whether it got a host array
        calls.append(isinstance(tensors["A"], np.ndarray))
        return {"X": cp.asarray(np.asarray(tensors["A"].data))}

    on_device.__name__ = "solve"
    device.run(on_device, {"A": big}, {})
    assert calls == [False] and cp.copies and cp.downloads == [False]  # up, computed, down (small: pageable)
    assert not device.merges("solve", {"A": big, "B": big[..., :1]})


def test_the_kernels_get_every_requests_host_arrays_read_only():
    """service.device.read_only on each way to the CPU kernels: a CPU device's call and merged call, a GPU
    service's host job alone and merged. Writable arrays (a JSON request's, a merged batch's) arrive as
    read-only views (Numba builds each kernel once, for read-only arrays: the warm-up's); the caller's
    arrays keep their own flags."""
    from service.device import GpuDevice, PinnedStaging

    seen: list[dict[str, bool]] = []

    def solve(tensors, options):  # a stand-in compute, named as the operation whose host path it takes
        seen.append({k: v.flags.writeable for k, v in tensors.items()})
        return {"X": np.zeros(1)}

    cp = _StreamingCupy()
    gpu = object.__new__(GpuDevice)
    gpu._cp, gpu.metrics, gpu._stage_children = cp, None, {}
    gpu._staging, gpu.host_max_n, gpu._pinner = PinnedStaging(cp, None), 32, no_pinner()
    gpu._streams = (cp.Stream(), cp.Stream(), cp.Stream())
    A, B = np.ones((2, 8, 8)), np.ones((2, 8, 1))
    for device in (CpuDevice(), gpu):
        device.run(solve, {"A": A, "B": B}, {})
        device.run_stacked(solve, {"A": [A[:1], A[1:]], "B": [B[:1], B[1:]]}, {})
    assert seen == [{"A": False, "B": False}] * 4 and cp.copies == []
    assert A.flags.writeable and B.flags.writeable
