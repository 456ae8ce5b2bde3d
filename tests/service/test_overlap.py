"""The worker on a device that overlaps (a GPU): the next job is started before the last one's answer is
collected, a lone job is collected at once, failures stay per request, memory and barriers are respected.

The device here is the CPU with a recording ``launch``: what it checks is the worker's order of calls,
which is the same on a GPU (``GpuDevice.launch`` uploads and computes, ``result()`` downloads and waits).
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from service.device import CpuDevice, Launched
from service.errors import unavailable
from service.metrics import Metrics
from service.operations import OPERATIONS
from service.worker import DeviceWorker
from tests.service.test_batching import _FakeCupy

SOLVE = OPERATIONS["solve"]


def _tensors(tag: float) -> dict[str, np.ndarray]:
    return {"A": np.eye(2) * 2.0, "B": np.full(2, tag)}


def _tags(tensors) -> list[float]:
    """The distinct values of B, which name this file's jobs (none for other operations)."""
    return sorted({float(x) for x in np.asarray(tensors.get("B", [])).ravel()})


class _Later(Launched):
    def __init__(self, device: OverlappingDevice, tags: list[float], answer: dict) -> None:
        super().__init__(answer)
        self.device, self.tags = device, tags

    def result(self) -> dict:
        self.device.events.append(("result", self.tags))
        if self.tags == self.device.fail_result:
            raise RuntimeError("lost on the way back")
        return super().result()


class OverlappingDevice(CpuDevice):
    """Computes at launch, records when each job is launched and when its answer is collected."""

    overlaps = True

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, list[float]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.launching = threading.Event()
        self.fail_result: list[float] | None = None  # the tags of the call whose collect fails
        self.out_of_memory_once = False

    def _launched(self, tags: list[float], answer_of) -> _Later:
        self.launching.set()
        self.gate.wait(10)
        if self.out_of_memory_once and any(e[0] == "launch" for e in self.events[-1:]):
            self.out_of_memory_once = False
            self.events.append(("out of memory", tags))
            raise unavailable("device_out_of_memory", "no room beside the job in flight", 1)
        self.events.append(("launch", tags))
        return _Later(self, tags, answer_of())

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


def test_the_next_job_starts_before_the_last_ones_answer_is_collected():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0])
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        for tag, answer in zip([1.0, 2.0, 3.0], answers, strict=True):
            np.testing.assert_array_equal(answer["X"], np.full(2, tag / 2))

    _scenario(device, body)
    assert device.events == [
        ("launch", [1.0]),
        ("launch", [2.0]),
        ("result", [1.0]),
        ("launch", [3.0]),
        ("result", [2.0]),
        ("result", [3.0]),
    ]


def test_a_lone_job_is_collected_at_once():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        for tag in (1.0, 2.0):  # one at a time: the worker must not hold an answer waiting for a next job
            answer = await asyncio.wait_for(_submit(worker, tag), 5)
            np.testing.assert_array_equal(answer["X"], np.full(2, tag / 2))

    _scenario(device, body)
    assert device.events == [("launch", [1.0]), ("result", [1.0]), ("launch", [2.0]), ("result", [2.0])]


def test_merged_calls_overlap_too_and_a_failed_collect_answers_each_job_alone():
    device = OverlappingDevice()
    device.fail_result = [2.0, 3.0]

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0, 3.0])
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        for tag, answer in zip([1.0, 2.0, 3.0], answers, strict=True):
            np.testing.assert_array_equal(answer["X"], np.full(2, tag / 2))

    _scenario(device, body, max_batch=8)
    # 1 alone (taken before the others were queued), then 2 and 3 merged, started before 1's answer
    # is collected; their collect fails, so each is computed again alone (device.run) and answered.
    assert device.events == [("launch", [1.0]), ("launch", [2.0, 3.0]), ("result", [1.0]), ("result", [2.0, 3.0])]


def test_a_failed_collect_of_one_job_is_that_requests_error():
    device = OverlappingDevice()
    device.fail_result = [1.0]

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        first, second = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
        assert isinstance(first, RuntimeError) and "lost on the way back" in str(first)
        np.testing.assert_array_equal(second["X"], np.full(2, 1.0))

    _scenario(device, body)


def test_an_error_at_launch_is_that_requests_alone():
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
    device.out_of_memory_once = True

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        answers = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert [float(a["X"][0]) for a in answers] == [0.5, 1.0]

    _scenario(device, body)
    assert device.events == [
        ("launch", [1.0]),
        ("out of memory", [2.0]),
        ("result", [1.0]),
        ("launch", [2.0]),
        ("result", [2.0]),
    ]


def test_a_call_waits_for_the_job_in_flight():
    device = OverlappingDevice()

    async def body(worker: DeviceWorker) -> None:
        futures = await _hold_first(device, worker, [1.0, 2.0])
        called = asyncio.ensure_future(asyncio.to_thread(worker.call, lambda: device.events.append(("call", []))))
        await asyncio.wait_for(asyncio.gather(*futures, called), 10)

    _scenario(device, body)
    assert device.events[-1] == ("call", [])
    assert device.events.count(("result", [1.0])) == device.events.count(("result", [2.0])) == 1


@pytest.mark.parametrize("overlaps", [False, True])
def test_answers_are_the_same_with_and_without_overlap(overlaps, rng):
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
def test_on_a_gpu_overlapped_jobs_answer_what_each_job_alone_does(rng):
    """Jobs of different sizes and operations queued together, so that each is uploaded while the last
    computes and downloads (pinned staging for the big ones, pageable copies for the small): every answer
    equals, bit for bit, the same job run alone on the same device. A buffer reused too early (an input
    freed while the compute stream still reads it, a staging buffer handed out during its copy) shows here.
    """
    from service.device import GpuDevice

    device = GpuDevice(0)
    ops = OPERATIONS
    jobs = []
    for i in range(24):
        n = (4, 48, 300, 700)[i % 4]
        A = rng.standard_normal((3, n, n)) + n * np.eye(n)
        B = rng.standard_normal((3, n, 2))
        name = ("solve", "lu_factor", "lu_unpack", "solve")[i % 4]
        if name == "lu_unpack":
            factored = ops["lu_factor"].compute({"A": A}, {"pivot": True})
            tensors = {"LU": factored["LU"], "pivots": factored["pivots"]}
        elif name == "lu_factor":
            tensors = {"A": A}
        else:
            tensors = {"A": A, "B": B}
        jobs.append((name, tensors))

    async def body(worker: DeviceWorker) -> None:
        futures = [
            asyncio.ensure_future(worker.submit(name, ops[name].compute, tensors, dict(ops[name].options)))
            for name, tensors in jobs
        ]
        overlapped = await asyncio.wait_for(asyncio.gather(*futures), 120)
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
        worker = DeviceWorker(device, Metrics("gpu", "test"), max_queue=64, retry_after_s=1, max_batch=1)
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

        class Event:
            def record(self, stream=None) -> None:
                pass

            def synchronize(self) -> None:
                pass

        class OutOfMemoryError(MemoryError):
            pass

        self.Stream = Stream
        self.cuda.Event = Event
        self.cuda.get_elapsed_time = staticmethod(lambda start, end: 0.0)
        self.cuda.memory = type("memory", (), {"OutOfMemoryError": OutOfMemoryError})
        self.asnumpy = lambda a, stream=None: np.array(a.data)


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
    device._streams = (cp.Stream(), cp.Stream(), cp.Stream())
    seen: list[weakref.ref] = []

    def compute(tensors, options):
        seen.append(weakref.ref(tensors["A"]))
        return {"X": cp.asarray(tensors["A"].data * 2)}

    big = np.ones((4, 64, 64))  # 128 KiB: staged through pinned memory
    first = device.launch(compute, {"A": big}, {})
    second = device.launch(compute, {"A": big * 3}, {})
    gc.collect()
    assert len(cp.pinned) == 2  # the second job was not staged into the first one's buffer
    assert seen[0]() is not None and seen[1]() is not None  # both jobs' inputs still referenced
    np.testing.assert_array_equal(first.result()["X"], big * 2)
    del first
    gc.collect()
    assert seen[0]() is None and seen[1]() is not None  # the first job's inputs went with its result
    third = device.launch(compute, {"A": big * 5}, {})
    assert len(cp.pinned) == 2  # staged into the first job's buffer, free again
    np.testing.assert_array_equal(second.result()["X"], big * 6)
    np.testing.assert_array_equal(third.result()["X"], big * 10)
    with pytest.raises(RuntimeError, match="collected once"):
        third.result()
    assert sorted(len(bufs) for bufs in device._staging._free.values()) == [2]  # both buffers free
