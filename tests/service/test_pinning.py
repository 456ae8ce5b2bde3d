"""Page-locked receive buffers (service.pinning) with the real body pool and stand-ins for the driver calls.

What runs on a device (``cudaHostRegister`` / ``cudaHostUnregister``, the upload from a registered
body) is checked by ``make gpu-proof``'s 256 MiB transfer checks; here: which buffers get pinned and
when, that a buffer is never freed while registered, the shared pinned cap, a driver that refuses,
shutdown, and that the GPU upload takes a tensor straight from a pinned body and stages the others.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref

import numpy as np
import pytest

from service.bodies import BodyPool
from service.pinning import BodyPinner

MiB = 1 << 20


class Driver:
    """Records register / unregister calls; a cap stands in for LU_GPU_PINNED_BYTES."""

    def __init__(self, cap: int | None = None, fail: bool = False) -> None:
        self.cap, self.fail = cap, fail
        self.reserved = 0
        self.calls: list[tuple[str, int, int]] = []
        self.live: dict[int, int] = {}  # registered pointer -> bytes
        self.gate = threading.Event()
        self.gate.set()
        self.alive_at_unregister: list[bool] = []
        self.covered_at_unregister: list[bool] = []
        self.watch: weakref.ref | None = None
        self.pinner_made: BodyPinner | None = None

    def register(self, ptr: int, nbytes: int) -> None:
        self.gate.wait(10)
        if self.fail:
            raise RuntimeError("cudaErrorNotSupported")
        assert ptr not in self.live
        self.live[ptr] = nbytes
        self.calls.append(("register", ptr, nbytes))

    def unregister(self, ptr: int) -> None:
        assert ptr in self.live, "unregistered what was not registered"
        if self.watch is not None:
            self.alive_at_unregister.append(self.watch() is not None)
            if self.watch() is not None and self.pinner_made is not None:
                self.covered_at_unregister.append(self.pinner_made.covers(self.watch()))
        self.calls.append(("unregister", ptr, self.live.pop(ptr)))

    def reserve(self, nbytes: int) -> bool:
        if self.cap is not None and self.reserved + nbytes > self.cap:
            return False
        self.reserved += nbytes
        return True

    def unreserve(self, nbytes: int) -> None:
        self.reserved -= nbytes
        assert self.reserved >= 0

    def pinner(self) -> BodyPinner:
        self.pinner_made = BodyPinner(self.register, self.unregister, self.reserve, self.unreserve)
        return self.pinner_made


def tensor_in(lease, nbytes: int = 1 << 16, offset: int = 128) -> np.ndarray:
    """A decoded tensor: a view into the body's bytes, as the binary codec makes it."""
    return np.frombuffer(lease.view, dtype=np.float64, count=nbytes // 8, offset=offset)


def test_a_buffer_is_pinned_when_it_goes_back_idle_and_later_bodies_in_it_are_covered():
    d = Driver()
    pool = BodyPool(64 * MiB, None, d.pinner())
    first = pool.take(3 * MiB)
    assert not pool.pinner.covers(tensor_in(first))  # a fresh buffer: not pinned while its request runs
    first.release()
    assert pool.pinner.flush(10)
    ((op, ptr, nbytes),) = d.calls
    assert op == "register" and nbytes == first.capacity and pool.pinner.pinned_bytes == nbytes
    second = pool.take(3 * MiB)  # the same size class: the same buffer, pinned
    assert second.reused
    t = tensor_in(second)
    assert ptr <= t.ctypes.data and pool.pinner.covers(t)
    assert not pool.pinner.covers(t[::2])  # not C-contiguous: staged
    assert not pool.pinner.covers(np.ones(8))  # elsewhere
    second.release()
    assert pool.pinner.flush(10)
    assert len(d.calls) == 1  # already pinned: not again
    assert d.reserved == nbytes


def test_small_buffers_and_buffers_over_the_cap_are_not_pinned():
    d = Driver(cap=4 * MiB)
    pool = BodyPool(64 * MiB, None, d.pinner())
    small = pool.take(BodyPinner.MIN_BYTES // 2)  # pooled (over 64 KiB), but too small to pin
    big = pool.take(3 * MiB)
    bigger = pool.take(3 * MiB)
    for lease in (small, big, bigger):
        lease.release()
    assert pool.pinner.flush(10)
    assert [c[0] for c in d.calls] == ["register"]  # the second 3 MiB buffer does not fit the 4 MiB cap
    assert d.reserved == d.calls[0][2] <= 4 * MiB


def test_a_buffer_the_pool_lets_go_is_unpinned_first_and_kept_alive_until_then():
    d = Driver()
    pool = BodyPool(64 * MiB, None, d.pinner())
    lease = pool.take(2 * MiB)
    lease.release()
    assert pool.pinner.flush(10)
    (_, ptr, nbytes) = d.calls[0]
    buffer = pool._by_class[lease.capacity][0]
    d.watch = weakref.ref(buffer)
    del buffer, lease  # (a released lease's view still refers to its buffer)
    assert pool.reclaim(1) == nbytes  # the budget asks for memory: the idle buffer goes
    assert pool.pinner.flush(10)
    assert d.calls[-1] == ("unregister", ptr, nbytes)
    assert d.alive_at_unregister == [True]  # its pages were not freed while registered
    assert d.covered_at_unregister == [False]  # and no upload could take it for pinned any more
    gc.collect()
    assert d.watch() is None  # and the pinner let go of it after
    assert pool.pinner.pinned_bytes == 0 and d.reserved == 0 and pool.pinner._index == ((), ())


def test_evicted_and_unkept_buffers_are_unpinned():
    d = Driver()
    pool = BodyPool(4 * MiB, None, d.pinner())  # room for one 3 MiB buffer idle
    a, b = pool.take(3 * MiB), pool.take(3 * MiB)
    a.release()
    assert pool.pinner.flush(10)
    b.release()  # kept: evicts a (the oldest), which is unpinned
    assert pool.pinner.flush(10)
    assert [c[0] for c in d.calls] == ["register", "unregister", "register"]
    assert len(d.live) == 1 and d.reserved == sum(d.live.values())
    pool.clear()
    assert pool.pinner.flush(10)
    assert not d.live and d.reserved == 0


def test_a_pinned_buffer_the_budget_will_not_keep_is_unpinned():
    class Tight:  # service.budget.MemoryBudget's face to the pool; refuses to keep anything idle
        def __init__(self) -> None:
            self.refuse = False

        def add_reclaimer(self, fn) -> None:
            pass

        def take_quietly(self, nbytes: int) -> bool:
            return not self.refuse

        def give(self, nbytes: int) -> None:
            pass

    d, budget = Driver(), Tight()
    pool = BodyPool(64 * MiB, budget, d.pinner())  # type: ignore[arg-type]
    lease = pool.take(3 * MiB)
    lease.release()
    assert pool.pinner.flush(10) and len(d.live) == 1
    lease = pool.take(3 * MiB)  # lent again, pinned
    budget.refuse = True
    lease.release()  # the budget has no room to keep it idle: freed, so unpinned first
    assert pool.pinner.flush(10)
    assert [c[0] for c in d.calls] == ["register", "unregister"] and not d.live and d.reserved == 0


def test_a_buffer_dropped_before_its_registration_ran_is_never_left_registered():
    d = Driver()
    d.gate.clear()  # the pinning thread blocks in its first registration
    pool = BodyPool(64 * MiB, None, d.pinner())
    first, second = pool.take(2 * MiB), pool.take(5 * MiB)
    first.release()
    second.release()  # queued behind the first
    pool.clear()  # both dropped while the first registration is still running
    d.gate.set()
    assert pool.pinner.flush(10)
    assert not d.live and d.reserved == 0 and pool.pinner.pinned_bytes == 0
    assert [c[0] for c in d.calls] in (["register", "unregister"], [])  # the second one: skipped


def test_a_driver_that_refuses_stops_pinning_and_nothing_else(caplog):
    d = Driver(fail=True)
    pool = BodyPool(64 * MiB, None, d.pinner())
    with caplog.at_level(logging.WARNING, logger="service.pinning"):
        for size in (2 * MiB, 3 * MiB, 5 * MiB, 9 * MiB):  # each refused; the third in a row stops pinning
            lease = pool.take(size)
            lease.release()
            assert pool.pinner.flush(10)
    assert pool.pinner.failed and not d.calls and d.reserved == 0
    assert sum("no more pinning" in r.getMessage() for r in caplog.records) == 1
    lease = pool.take(2 * MiB)  # bodies are still received, into the pool's buffers
    assert lease.reused and not pool.pinner.covers(tensor_in(lease))
    lease.release()
    assert pool.pinner.flush(10) and d.reserved == 0


def test_a_refusal_now_and_then_does_not_stop_pinning():
    d = Driver(fail=True)
    pool = BodyPool(64 * MiB, None, d.pinner())
    for size in (2 * MiB, 3 * MiB):
        lease = pool.take(size)
        lease.release()
    assert pool.pinner.flush(10) and not pool.pinner.failed and d.reserved == 0
    d.fail = False
    lease = pool.take(2 * MiB)  # the same buffer, back idle again: tried again, pinned
    lease.release()
    assert pool.pinner.flush(10)
    assert [c[0] for c in d.calls] == ["register"] and d.reserved == d.calls[0][2]


def test_a_buffer_whose_unregistration_fails_is_kept_and_stays_counted(caplog):
    d = Driver()
    pool = BodyPool(64 * MiB, None, d.pinner())
    lease = pool.take(2 * MiB)
    lease.release()
    assert pool.pinner.flush(10)
    buffer = pool._by_class[lease.capacity][0]
    watch = weakref.ref(buffer)
    del buffer, lease

    def refuse(ptr):
        raise RuntimeError("cudaErrorCudartUnloading")

    pool.pinner._unregister = refuse
    with caplog.at_level(logging.ERROR, logger="service.pinning"):
        pool.clear()
        assert pool.pinner.flush(10)
    gc.collect()
    assert watch() is not None  # its pages may still be locked: never freed
    assert pool.pinner.pinned_bytes == d.reserved > 0 and not pool.pinner.covers(np.ones(1))
    assert any("unregistering a receive buffer failed" in r.getMessage() for r in caplog.records)


def test_the_pool_tells_the_pinner_under_its_lock():
    """So that a buffer the pool lets go cannot be pinned by a concurrent give-back after it was dropped."""
    pool = BodyPool(4 * MiB, None)
    seen: list[tuple[str, bool]] = []

    class Spy:
        def idle(self, buffer):
            seen.append(("idle", pool._lock.locked()))

        def drop(self, buffer):
            seen.append(("drop", pool._lock.locked()))

    pool.pinner = Spy()  # type: ignore[assignment]
    a, b = pool.take(3 * MiB), pool.take(3 * MiB)
    a.release()  # kept
    b.release()  # kept, a evicted
    pool.reclaim(1)  # b
    assert [op for op, _ in seen] == ["idle", "drop", "idle", "drop"]
    assert all(locked for _, locked in seen)


def test_staging_does_not_drop_its_idle_buffers_when_that_cannot_make_room():
    """With receive buffers pinned under the same cap, dropping every idle staging buffer may still not make
    room: then nothing is dropped (a ``cudaFreeHost`` each, and the buffers are needed next time)."""
    from service.device import PinnedStaging
    from tests.service.test_device_memory import HostAllocator

    staging = PinnedStaging(HostAllocator(), limit=8 * MiB)
    idle = staging.take(2 * MiB)
    staging.release([idle])
    assert staging.reserve(5 * MiB)  # a pinned receive buffer
    assert staging.take(4 * MiB) is None  # 5 + 4 > 8 even without the idle 2 MiB buffer
    assert staging.idle() == 1 and staging.held_bytes == 7 * MiB
    assert staging.take(2 * MiB) == idle  # still there
    staging.unreserve(5 * MiB)
    assert staging.held_bytes == 2 * MiB


@pytest.mark.parametrize("pinned", [True, False])
def test_the_gpu_upload_takes_a_tensor_straight_from_a_pinned_body(pinned):
    """GpuDevice._upload with the CuPy stand-in: a tensor in a pinned receive buffer is copied to the device
    from where it lies (no staging buffer, no host copy); elsewhere it is staged as before."""
    from service.device import GpuDevice, PinnedStaging
    from tests.service.test_batching import _FakeCupy

    d = Driver()
    pool = BodyPool(64 * MiB, None, d.pinner())
    lease = pool.take(2 * MiB)
    lease.release()
    assert pool.pinner.flush(10)
    lease = pool.take(2 * MiB) if pinned else pool.take(7 * MiB)  # reused and pinned, or fresh
    t = tensor_in(lease, 1 << 20).reshape(256, 512)
    t[...] = np.arange(t.size).reshape(t.shape)
    cp = _FakeCupy()
    device = object.__new__(GpuDevice)
    device._cp, device._staging, device._pinner = cp, PinnedStaging(cp, None), pool.pinner
    staged: list = []
    sources: list = []
    real_set = cp.ndarray.set

    def recording_set(self, host, stream=None):
        sources.append(host)
        real_set(self, host, stream)

    cp.ndarray.set = recording_set
    dev = device._upload(t, None, staged)
    np.testing.assert_array_equal(dev.data, t)
    assert len(sources) == 1
    if pinned:
        assert sources[0] is t and not staged and not cp.pinned  # from the body itself
    else:
        assert not np.shares_memory(sources[0], t) and len(staged) == 1  # through a staging buffer
    lease.release()


# --------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_gpu_a_registered_host_buffer_uploads_asynchronously_and_unregisters():
    """The driver calls GpuDevice gives its pinner, on the device: register a pool-like buffer, upload a view
    of it on a stream, unregister."""
    import cupy

    from service.device import _HOST_REGISTER_PORTABLE

    buffer = np.empty(3 * MiB, np.uint8)
    cupy.cuda.runtime.hostRegister(buffer.ctypes.data, buffer.nbytes, _HOST_REGISTER_PORTABLE)
    try:
        view = np.frombuffer(memoryview(buffer), np.float64, count=(1 << 20) // 8, offset=200).reshape(256, 512)
        view[...] = np.arange(view.size).reshape(view.shape)
        stream = cupy.cuda.Stream(non_blocking=True)
        dev = cupy.empty(view.shape, view.dtype)
        dev.set(view, stream=stream)
        stream.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(dev), view)
    finally:
        cupy.cuda.runtime.hostUnregister(buffer.ctypes.data)


@pytest.mark.gpu
@pytest.mark.anyio
async def test_gpu_a_body_in_a_pinned_buffer_is_uploaded_without_staging(make_client, rng, monkeypatch):
    """The service on a device: the first 8 MiB body's buffer is page-locked once it is idle; the same
    request again lands in it and its LU goes up from the body (no staging); the answers are equal."""
    from tests.service.wire import binary_request

    client = await make_client(device="gpu", gpu_host_max_n=0)
    pool, device = client.app.state.bodies, client.app.state.worker.device
    n = 1024
    LU = np.triu(rng.standard_normal((n, n))) + n * np.eye(n)
    body, headers = binary_request({"LU": LU, "pivots": np.arange(1, n + 1, dtype=np.int32), "B": np.ones((n, 1))})
    first = await client.post("/lu_solve", content=body, headers=headers)
    assert first.status_code == 200
    for _ in range(300):  # the request's lease goes back to the pool as it ends, then the pin is queued
        if pool.pinner.flush(30) and pool.pinner.pinned_bytes >= len(body):
            break
        await asyncio.sleep(0.01)
    assert pool.pinner.pinned_bytes >= len(body), pool.pinner.failed
    staged: list = []
    real = device._staging.stage
    monkeypatch.setattr(device._staging, "stage", lambda a, s: staged.append(a.shape) or real(a, s))
    second = await client.post("/lu_solve", content=body, headers=headers)
    assert second.status_code == 200 and second.content == first.content
    assert (n, n) not in staged  # the LU went up from the pinned body


def test_staging_hands_dropped_buffers_to_the_driver_outside_its_lock():
    """``cudaFreeHost`` may wait for the device; the body pool waits on the staging lock (reserve)."""
    from service.device import PinnedStaging
    from tests.service.test_device_memory import HostAllocator

    host = HostAllocator()
    calls: list[bool] = []
    staging = PinnedStaging(host, limit=4 * MiB)

    class Pool:
        def free_all_blocks(self) -> None:
            calls.append(staging._lock.locked())

    host.get_default_pinned_memory_pool = lambda: Pool()  # type: ignore[attr-defined]
    staging.release([staging.take(2 * MiB)])
    big = staging.take(4 * MiB)
    assert big is not None  # the idle 2 MiB buffer dropped for room
    staging.release([big])
    staging.clear()
    assert calls == [False, False]


def test_a_failing_pinner_does_not_let_the_pool_s_accounting_down(caplog):
    from service.budget import MemoryBudget

    class Broken:
        def idle(self, buffer):
            raise RuntimeError("can't start new thread")

        def drop(self, buffer):
            raise RuntimeError("can't start new thread")

    budget = MemoryBudget(64 * MiB)
    pool = BodyPool(8 * MiB, budget, Broken())  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="service.bodies"):
        lease = pool.take(3 * MiB)
        lease.release()  # kept idle: the pinner raises, the pool goes on
        assert pool.idle_bytes == lease.capacity and budget.in_use == pool.held_bytes
        pool.clear()
    assert pool.idle_bytes == 0 and budget.in_use == 0
    assert any("telling the body pinner failed" in r.getMessage() for r in caplog.records)


def test_a_pinning_thread_that_cannot_start_is_started_with_a_later_task(monkeypatch, caplog):
    d = Driver()
    pool = BodyPool(64 * MiB, None, d.pinner())
    real_start = threading.Thread.start
    refusals = [1]

    def start(self):
        if refusals:
            refusals.pop()
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    with caplog.at_level(logging.ERROR, logger="service.pinning"):
        first = pool.take(2 * MiB)
        first.release()  # its pin task is queued; the thread did not start
    assert any("could not start" in r.getMessage() for r in caplog.records)
    second = pool.take(3 * MiB)
    second.release()  # starts the thread: both tasks run, in order
    assert pool.pinner.flush(10)
    assert [c[0] for c in d.calls] == ["register", "register"]
    assert d.reserved == sum(d.live.values())


def test_staging_gives_back_its_count_when_the_driver_fails():
    from service.device import PinnedStaging
    from tests.service.test_device_memory import HostAllocator

    host = HostAllocator()

    class Pool:
        def free_all_blocks(self) -> None:
            raise RuntimeError("cudaErrorIllegalAddress")

    host.get_default_pinned_memory_pool = lambda: Pool()  # type: ignore[attr-defined]
    staging = PinnedStaging(host, limit=4 * MiB)
    staging.release([staging.take(2 * MiB)])
    with pytest.raises(RuntimeError):
        staging.take(4 * MiB)  # the idle buffer dropped for room; handing it to the driver fails
    assert staging.held_bytes == 0
