"""The one thread that owns the device, fed by a bounded queue.

Compute never runs on the event loop: a route awaits :meth:`DeviceWorker.submit`,
which queues the job or, when ``LU_MAX_QUEUE`` jobs already wait, fails at once
with a 503 and ``Retry-After`` so that load balancers and clients back off.
Jobs run in order, compatible queued ones merged into one call (dynamic
batching, :mod:`service.batcher`); a job whose client went away before it
started is skipped. Out-of-memory on the device is answered with a 503 and the
worker frees its cached memory and goes on serving. A bug in the worker's own code
(an exception outside a job's error handling) is logged, the jobs it concerned are
answered 500 (no request is left waiting), and the worker goes on.

The thread and the event loop share the GIL, so every hand-over between them
costs: a wake-up of the other thread, and, when the other is busy, a wait for
the GIL (up to ``sys.getswitchinterval()``, 5 ms). Hand-overs are therefore
grouped: the jobs the event loop submits during one pass reach the thread as one
queue item at the loop's next pass (no timer: a lone request waits only for that
pass), and the answers of one batch go back in one ``call_soon_threadsafe``.
Requests the loop reads together thus reach the device together, which is what
lets batching merge them without ``LU_BATCH_DELAY_US``.

On a device whose jobs run in steps (``Device.overlaps``: the GPU, where a job is an
upload, a compute and a download on the device's streams), the worker keeps the last
job computed but not collected ("in flight") while another is queued: it queues the new
job's upload, then collects the answer in flight, then computes the new job, so that one
request's inputs go up while another's answer comes down. It never waits for a next job
to do so: with nothing queued, the answer is collected at once. A call, the stop and a
batch-delay wait come after the job in flight is collected; out of device memory while
uploading beside a job in flight, the worker collects that job and uploads again (the
memory check before the upload counts one job at a time). A job such a device computes whole
(``Device.overlapped`` false: a GPU's small jobs, computed on the host) runs as on the CPU, its answer
handed back at once; the job in flight, if any, is collected right after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from starlette.requests import ClientDisconnect

from service.batcher import MERGEABLE, gather, launch_merged, signature
from service.budget import Reservation
from service.device import Compute, Device
from service.errors import ServiceError, deadline_exceeded, unavailable
from service.metrics import Metrics

if TYPE_CHECKING:
    from service.protocol import BodySink

__all__ = ["DeviceWorker"]

log = logging.getLogger("service.worker")
T = TypeVar("T")


@dataclass(slots=True)  # the worker reads a few fields of every job it merges: no __dict__ to reach them through
class _Job:
    name: str
    compute: Compute
    tensors: Mapping[str, np.ndarray]
    options: Mapping[str, bool]
    future: asyncio.Future[dict[str, Any]]
    loop: asyncio.AbstractEventLoop
    queued_at: float
    # The request's memory reservation, held by the job too: a client that leaves while its job
    # computes must not free the budget for memory the computation still uses.
    reservation: Reservation | None = None
    deadline: float | None = None  # time.monotonic(); a job still queued after it is dropped
    signature: Any = None  # service.batcher.signature, when batching is on


@dataclass
class _InFlight:
    """Jobs computed as one call on a device that overlaps, their answers not collected yet."""

    jobs: list[_Job]
    launched: Any  # service.device.Launched: compute() and result()
    split: Callable[[dict[str, Any]], list[dict[str, Any]]]  # the call's outputs -> each job's answer
    busy_s: float = 0.0  # the worker's time on this call so far (lu_compute_seconds)


_STOP = object()
#: Interned job signatures kept (kinds of jobs: operation, options, shapes, dtypes); past it the table starts over.
_MAX_SIGNATURES = 256

#: The worker thread's stack. OpenBLAS's threaded getrf (SciPy's build, reached for n > 256 on the CPU
#: where MKL is not installed, LU_CORE_LAPACK=scipy, or off Intel's CPUs for float32 and outside n 384-1024)
#: puts ~0.5 MB frames on the caller's stack, recursively: n = 150 and 290 needed 3-5 MiB (measured: a thread
#: with 3 MiB crashed, SIGSEGV in dgetrf_parallel's prologue). Threads get the process default (8 MiB from
#: RLIMIT_STACK, less where the limit or a library says so); a server crashed that way under the full test
#: suite. Only the pages touched are committed.
WORKER_STACK_BYTES = 64 << 20


@contextlib.contextmanager
def _stack_size(nbytes: int) -> Iterator[None]:
    """Threads started inside get ``nbytes`` of stack (``threading.stack_size`` is process-wide:
    restored on exit)."""
    before = threading.stack_size(nbytes)
    try:
        yield
    finally:
        threading.stack_size(before)


def _is_live_job(item: Any) -> bool:
    return isinstance(item, _Job) and not item.future.done()


def _is_barrier(item: Any) -> bool:
    """A call (run on the worker in its turn: the warm-up, say) or the stop: no job runs ahead of it."""
    return not isinstance(item, _Job)


class DeviceWorker:
    def __init__(
        self,
        device: Device,
        metrics: Metrics,
        *,
        max_queue: int,
        retry_after_s: int,
        max_batch: int = 1,
        batch_delay_us: int = 0,
        max_batch_elements: int = 1 << 22,
    ) -> None:
        self.device = device
        self._metrics = metrics
        # Jobs reach the thread in groups: each event loop collects the jobs its callbacks submit during
        # one pass in an outbox and hands them over once, at its next pass (see _flush). The queue holds
        # those groups (lists), startup calls and the stop mark; its bound is kept in jobs, by submit.
        self._queue: queue.Queue[Any] = queue.Queue()
        self._max_queue = max_queue
        self._outboxes: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        self._signatures: dict[Any, Any] = {}  # interned job signatures (submit), at most _MAX_SIGNATURES
        self._submitted = 0  # jobs queued, counted on the event loop
        self._taken = 0  # jobs taken to run (or to drop), counted on the worker thread
        # Items of a group not looked at yet; run in order, after _pending.
        self._inbox: deque[Any] = deque()
        # Items taken out of the queue while gathering a batch that did not join it; run next, in order.
        self._pending: deque[Any] = deque()
        self._idle_s = 0.0  # of the current batch: time spent waiting for more jobs
        self._retry_after_s = retry_after_s
        self._max_batch = max_batch
        self._batch_delay_s = batch_delay_us / 1e6
        self._max_batch_elements = max_batch_elements
        self._thread: threading.Thread | None = None
        self._accepting = False
        self._started = threading.Event()
        self._children: dict[str, Any] = {}
        # On a device that overlaps: the last job computed, its answer not collected yet (the next
        # job's upload is queued first, so that it goes up while this one's answer comes down).
        self._in_flight: _InFlight | None = None
        self._landing_s = [0.0, 0.0]  # of the current batch: wall and CPU time spent landing the job in flight
        self._stop_by = math.inf  # after a stop: how long to wait for jobs still in an event loop's outbox

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the thread (again, after a stop: an app's lifespan may run more than once)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._in_flight = None  # (a thread that died with a job in flight: its futures are the loop's)
        self._started.clear()
        self._thread = threading.Thread(target=self._loop, name=f"lu-{self.device.kind}-worker", daemon=True)
        with _stack_size(WORKER_STACK_BYTES):
            self._thread.start()
        self._started.wait()
        self._accepting = True

    def stop(self, timeout: float | None = None) -> None:
        """Refuse new jobs, finish the queued ones, then end the thread."""
        self._accepting = False
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread and wait (startup work such as warm-up)."""
        done = threading.Event()
        box: dict[str, Any] = {}

        def job() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc
            finally:
                done.set()

        self._queue.put(job)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    @property
    def depth(self) -> int:
        """Jobs queued and not yet taken by the worker (the ones it computes now excluded)."""
        return self._submitted - self._taken

    # ------------------------------------------------------------------ submitting

    async def submit(
        self,
        name: str,
        compute: Compute,
        tensors: Mapping[str, np.ndarray],
        options: Mapping[str, bool],
        *,
        reservation: Reservation | None = None,
        deadline: float | None = None,
        connection: BodySink | None = None,
    ) -> dict[str, Any]:
        """Queue a job and wait for its answer. ``connection``: the HTTP request's (where
        :mod:`service.protocol` serves it): should the client leave while the job waits, the job fails
        with ``ClientDisconnect`` at once (a 499), and the worker skips it if it has not started."""
        if not self._accepting:
            raise unavailable("shutting_down", "the service is not accepting work", self._retry_after_s)
        if self.depth >= self._max_queue:
            self._metrics.rejected.labels("queue_full").inc()
            raise unavailable(
                "overloaded",
                f"{self._max_queue} requests are already waiting for the {self.device.kind}; retry later",
                self._retry_after_s,
            )
        loop = asyncio.get_running_loop()
        # Built here, on the event loop, so that the worker compares one value per job when it gathers a batch.
        # None: the job runs alone (batching off, an operation never merged, or a device whose answer
        # for it would depend on the batch: service.device.Device.merges).
        sig = None
        if self._max_batch > 1 and name in MERGEABLE and self.device.merges(name, tensors):
            # One object per kind of job (interned), so that the worker finds two jobs alike by identity,
            # without reading the tuples the event loop built for each (on the other core's cache).
            sig = signature(name, compute, tensors, options)
            sig = self._signatures.setdefault(sig, sig)
            if len(self._signatures) > _MAX_SIGNATURES:
                self._signatures = {sig: sig}
        held = reservation.retain() if reservation is not None else None
        job = _Job(
            name, compute, tensors, options, loop.create_future(), loop, time.perf_counter(), held, deadline, sig
        )
        outbox = self._outboxes.get(loop)
        if outbox is None:
            # The first job of this pass of the loop: hand the pass's jobs over at the next pass, so that
            # requests the loop reads together reach the worker together (and one wake-up, not one each).
            outbox = self._outboxes[loop] = []
            loop.call_soon(self._flush, loop)
        outbox.append(job)
        self._submitted += 1
        if len(outbox) >= self._max_batch:
            # A full batch already: hand it over now, so that the worker can start on it while the loop
            # goes on with its pass (and the queue bound sees the worker drain it).
            self._flush(loop)
        self._metrics.queue_depth.set(self.depth)
        if connection is None:
            return await job.future
        future = job.future
        connection.on_lost(lambda: future.done() or future.set_exception(ClientDisconnect()))
        try:
            return await future
        finally:
            connection.on_lost(None)

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        outbox = self._outboxes.pop(loop, None)
        if outbox:  # None: already handed over, full
            self._queue.put(outbox)

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        try:
            self.device.thread_init()
        finally:
            self._started.set()
        self._stop_by = math.inf
        while True:
            try:
                if self._step(self._metrics):
                    return
            except Exception:
                # A bug: the jobs it concerned are answered 500 (_settle: none is left waiting, each
                # request's 500 is counted and logged where it is answered); the worker goes on serving.
                log.exception("the device worker failed on an item; going on")

    def _step(self, metrics: Metrics) -> bool:
        """Take the next item and run it (a job batch, a call, the stop); True when the worker stops."""
        if self._in_flight is not None and not self._work_waiting():
            self._land()  # nothing to start meanwhile: the answer is collected now
        item = self._pending.popleft() if self._pending else self._next(None)
        if _is_barrier(item):
            self._land()  # a call or the stop: nothing runs past it while a job is in flight
        if item is _STOP:
            if self._work_left():
                # Jobs or calls that reached the queue after the stop (an event loop's hand-over at
                # its next pass) or wait in pending: finish them first, then stop.
                self._queue.put(_STOP)
                return False
            if self._outboxes and time.monotonic() < self._stop_by:
                # Jobs submitted just before the stop are still in an event loop's outbox: they are
                # handed over at the loop's next pass; finish them too (a closed loop: give up).
                self._stop_by = min(self._stop_by, time.monotonic() + 1.0)
                time.sleep(0.001)
                self._queue.put(_STOP)
                return False
            return True
        # Busy from here until the answers are handed back: wall time (GIL waits and preemption
        # included, a batch delay's wait not) and the thread's own CPU time (lu_worker_*_seconds).
        wall, cpu = time.perf_counter(), time.thread_time()
        self._idle_s = 0.0
        self._landing_s = [0.0, 0.0]
        if callable(item):
            item()
            return False
        if item.future.done():  # its client left while it was queued: skipped, not gathered into a batch
            self._taken += 1
            metrics.queue_depth.set(self.depth)
            _settle_all([], [item])
            return False
        try:
            batch = gather(
                item,
                self._take,
                self._pending,
                max_batch=self._max_batch,
                max_elements=self._max_batch_elements,
                delay_s=self._batch_delay_s,
                is_job=_is_live_job,
                is_barrier=_is_barrier,
            )
        except Exception:
            # A bug in gathering: what it took waits in pending again (gather's promise); this job runs
            # alone, so that every gathering makes progress and no request is lost or answered 500.
            log.exception("gathering a batch failed; the job runs alone")
            batch = [item]
        self._taken += len(batch)
        metrics.batch_wait.observe(time.perf_counter() - wall)
        metrics.queue_depth.set(self.depth)
        settled: list[tuple[_Job, bool, Any]] = []
        flying: _InFlight | None = None
        whole = True  # computed whole here, not started in steps (Device.overlapped)
        try:
            live = [
                job
                for job in batch
                if not job.future.done() and (job.deadline is None or not self._expired(job, settled))
            ]
            whole = not live or not self.device.overlapped(live[0].compute, live[0].tensors)
            if not whole:
                flying = self._start(live, settled)
            elif len(live) == 1:
                self._compute(live[0], settled)
            elif live:
                self._compute_merged(live, settled)
        finally:
            # Less the time spent landing the job that was in flight (_land counts its own).
            landed_wall, landed_cpu = self._landing_s
            metrics.worker_busy.inc(time.perf_counter() - wall - self._idle_s - landed_wall)
            metrics.worker_cpu.inc(time.thread_time() - cpu - landed_cpu)
            # Last: waking the event loop hands it the GIL, and the worker has nothing left to do.
            if flying is None:
                rest = batch
            else:  # the jobs in flight are answered when they land
                ids = {id(job) for job in flying.jobs}
                rest = [job for job in batch if id(job) not in ids]
            if rest:
                _settle_all(settled, rest)
        if flying is not None:  # (None: the job in flight, if any, landed in _start, or stays)
            self._in_flight = flying
        elif whole:
            # A job computed whole beside one in flight (a GPU's small job, on the host): its answer has
            # gone out without waiting for the device; the one in flight lands now, not behind more of them.
            self._land()
        return False

    # ------------------------------------------------------------------ overlapped jobs (a GPU)

    def _work_waiting(self) -> bool:
        """Whether an item can be taken at once (without waiting for the queue)."""
        return bool(self._pending or self._inbox) or not self._queue.empty()

    def _start(self, jobs: list[_Job], settled: list[tuple[_Job, bool, Any]]) -> _InFlight | None:
        """Start ``jobs`` (one, or merged into one call) on a device that :attr:`~Device.overlaps`: upload
        their inputs, land the job in flight meanwhile, then compute. The new job is returned to be
        landed later, or None when nothing is left to collect (failures are answered in ``settled``)."""
        start, landed_before = time.perf_counter(), self._landing_s[0]
        jobs = [job for job in jobs if not job.future.done()]  # clients that left while queued
        if not jobs:
            return None
        self._metrics.queue_wait.observe_many([start - job.queued_at for job in jobs])

        def busy() -> float:  # this job's time so far, less the time spent landing the one before
            return time.perf_counter() - start - (self._landing_s[0] - landed_before)

        try:
            flight = self._with_room(lambda: self._upload(jobs))
        except Exception as exc:
            self._land()
            self._fail(jobs, exc, settled, busy())
            return None
        self._land()  # the upload above runs on the device while the last job's answer comes back
        try:
            flight.launched.compute()  # nothing in flight now: out of memory here is this job's
        except Exception as exc:
            self._fail(jobs, exc, settled, busy())
            return None
        flight.busy_s = busy()
        return flight

    def _upload(self, jobs: list[_Job]) -> _InFlight:
        if len(jobs) == 1:
            job = jobs[0]
            return _InFlight(jobs, self.device.launch(job.compute, job.tensors, job.options), lambda out: [out])
        launched, split = launch_merged(self.device.launch_stacked, jobs)
        return _InFlight(jobs, launched, split)

    def _with_room(self, step: Callable[[], T]) -> T:
        """``step()``; when the device runs out of memory with a job in flight, again once that job has
        landed (the check before the upload counts one job at a time: two may not fit together)."""
        try:
            return step()
        except Exception as exc:
            if self._in_flight is None or not self.device.is_out_of_memory(exc):
                raise
        self._land()
        return step()

    def _fail(self, jobs: list[_Job], exc: Exception, settled: list[tuple[_Job, bool, Any]], busy_s: float) -> None:
        """A call failed after ``busy_s`` seconds: a lone job gets the error (its time counted, as for a job
        that succeeds); merged jobs run each alone (a singular system with check_errors, memory), so that
        every failure is answered to its own request, with its own batch indices."""
        if len(jobs) == 1:
            self._metrics.batch_size.observe(1)
            self._compute_seconds(jobs[0].name).observe(busy_s)
            settled.append((jobs[0], False, self._translate(exc)))
            return
        for job in jobs:
            self._compute(job, settled, waited=True)

    def _land(self) -> None:
        """Collect the answers of the job in flight, if any, and hand them back."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        settled: list[tuple[_Job, bool, Any]] = []
        try:
            try:
                answers = flight.split(flight.launched.result())
                settled.extend((job, True, answer) for job, answer in zip(flight.jobs, answers, strict=True))
            except Exception as exc:
                settled.clear()
                self._fail(flight.jobs, exc, settled, flight.busy_s + time.perf_counter() - wall)
            else:
                self._metrics.batch_size.observe(len(flight.jobs))
                busy = flight.busy_s + time.perf_counter() - wall
                self._compute_seconds(flight.jobs[0].name).observe(busy)
        finally:
            spent_wall, spent_cpu = time.perf_counter() - wall, time.thread_time() - cpu
            self._landing_s[0] += spent_wall
            self._landing_s[1] += spent_cpu
            self._metrics.worker_busy.inc(spent_wall)
            self._metrics.worker_cpu.inc(spent_cpu)
            _settle_all(settled, flight.jobs)

    def _work_left(self) -> bool:
        """Anything but the stop still to run: in pending, the current group, or the queue."""
        if self._pending or self._inbox:
            return True
        with self._queue.mutex:  # queue.Queue's own lock over its deque of items
            return any(item is not _STOP for item in self._queue.queue)

    def _next(self, timeout: float | None) -> Any:
        """The next item not looked at yet (a group's jobs one by one); queue.Empty when none comes."""
        if self._inbox:
            return self._inbox.popleft()
        item = self._queue.get(True, timeout)
        if isinstance(item, list):
            self._inbox.extend(item[1:])
            item = item[0]
        return item

    def _take(self, timeout: float | None) -> list[Any]:
        """What arrived next, as a list: the rest of the current group, else the next queue item (for
        :func:`service.batcher.gather`, which looks at a whole group in one loop); queue.Empty when none."""
        if self._inbox:
            items = list(self._inbox)
            self._inbox.clear()
            return items
        if timeout is None:
            item = self._queue.get_nowait()
        else:
            self._land()  # an answer is not held while the worker waits for more jobs (LU_BATCH_DELAY_US)
            start = time.perf_counter()
            try:
                item = self._queue.get(True, timeout)
            finally:
                # Waiting for more jobs (LU_BATCH_DELAY_US) is idle time, not busy time.
                self._idle_s += time.perf_counter() - start
        return item if isinstance(item, list) else [item]

    def _compute_merged(self, jobs: list[_Job], settled: list[tuple[_Job, bool, Any]]) -> None:
        """One call for compatible jobs (see service.batcher); each alone if the call fails."""
        start = time.perf_counter()
        self._metrics.queue_wait.observe_many([start - job.queued_at for job in jobs])
        try:
            launched, split = launch_merged(self.device.launch_stacked, jobs)
            launched.compute()
            answers = split(launched.result())
        except Exception as exc:  # a singular system (check_errors) or memory: each alone
            self._fail(jobs, exc, settled, time.perf_counter() - start)
            return
        self._metrics.batch_size.observe(len(jobs))
        self._compute_seconds(jobs[0].name).observe(time.perf_counter() - start)
        settled.extend((job, True, answer) for job, answer in zip(jobs, answers, strict=True))

    def _compute_seconds(self, name: str) -> Any:
        # labels() costs a lock and a dict lookup per call: resolve each operation's child once.
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = self._metrics.compute_seconds.labels(name, self.device.kind)
        return child

    def _expired(self, job: _Job, settled: list[tuple[_Job, bool, Any]]) -> bool:
        """Drop a job whose deadline passed while it was queued: answered 408 and counted, never computed."""
        if job.deadline is None or time.monotonic() <= job.deadline:
            return False
        self._metrics.deadline_exceeded.inc()
        error = deadline_exceeded(f"{job.name}: the request's deadline passed while it waited for the device")
        settled.append((job, False, error))
        return True

    def _compute(self, job: _Job, settled: list[tuple[_Job, bool, Any]], *, waited: bool = False) -> None:
        if job.future.done():  # the client left while the job waited (cancelled, or failed by on_lost)
            return
        start = time.perf_counter()
        if not waited:
            self._metrics.queue_wait.observe(start - job.queued_at)
        self._metrics.batch_size.observe(1)
        try:
            result: Any = self.device.run(job.compute, job.tensors, job.options)
            ok = True
        except Exception as exc:
            ok, result = False, self._translate(exc)
        self._compute_seconds(job.name).observe(time.perf_counter() - start)
        settled.append((job, ok, result))

    def _translate(self, exc: Exception) -> Exception:
        if isinstance(exc, ServiceError):  # answered as it is (Device.run's 503 names memory too)
            return exc
        if self.device.is_out_of_memory(exc):
            log.warning("out of %s memory: %s", self.device.kind, exc)
            self._metrics.rejected.labels("device_out_of_memory").inc()
            self.device.release_memory()
            return unavailable(
                "device_out_of_memory",
                f"the {self.device.kind} ran out of memory for this request; retry later or send a smaller one",
                self._retry_after_s,
            )
        return exc  # lu_core's errors (422 in the handler) and bugs (500, logged there)


def _settle_all(settled: list[tuple[_Job, bool, Any]], batch: list[_Job]) -> None:
    """Hand the answers to their event loops: one wake-up per loop per batch, not one per job.

    The jobs' holds on their requests' memory reservations (every job of ``batch``, answered or
    dropped) are let go there too, after the answers: per-request work the worker need not do.
    ``call_soon_threadsafe`` writes to the loop's self-pipe, a system call that releases the GIL;
    on a busy server the worker then waits for the event loop to hand the GIL back.
    """
    loop = batch[0].loop
    if all(job.loop is loop for job in batch):  # the service's case: one event loop
        groups = [(loop, settled, batch)]
    else:
        by_loop: dict[asyncio.AbstractEventLoop, tuple[list[tuple[_Job, bool, Any]], list[_Job]]] = {}
        for job in batch:
            by_loop.setdefault(job.loop, ([], []))[1].append(job)
        for answer in settled:
            by_loop[answer[0].loop][0].append(answer)
        groups = [(lp, answers, jobs) for lp, (answers, jobs) in by_loop.items()]
    for lp, answers, jobs in groups:
        try:
            lp.call_soon_threadsafe(_settle, answers, jobs)
        except RuntimeError:  # the loop closed (an app torn down with jobs queued): nobody waits for them
            _let_go(jobs)


def _settle(answers: list[tuple[_Job, bool, Any]], jobs: list[_Job]) -> None:
    try:
        for job, ok, value in answers:
            future = job.future
            if future.done():  # cancelled by its client (or, a bug, answered already)
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
    finally:
        for job in jobs:
            if not job.future.done():  # a bug left it without an answer: a 500, not a request that hangs
                job.future.set_exception(_UNANSWERED)
        _let_go(jobs)


# What a job gets when the worker failed to answer it (a bug, logged by the worker): answered 500.
_UNANSWERED = RuntimeError("the device worker did not answer this job; see the log (service.worker)")


def _let_go(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.reservation is not None:
            job.reservation.release()
