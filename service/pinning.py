"""Page-locked receive buffers on a GPU: large request bodies are uploaded straight from where they arrived.

A binary request's tensors are views into its receive buffer (``service.bodies``). From
pageable memory a host-to-device copy is not asynchronous (the driver stages it through a
pinned bounce buffer of its own) and the service used to copy each large input into a
pinned staging buffer first (``service.device.PinnedStaging``): a host ``memcpy`` of the
whole body on the upload's path (on the H200 a 256 MiB upload took 32 ms, a bare pinned copy of the
bytes 4.9 ms).
So the receive buffers the pool keeps for reuse are page-locked (``cudaHostRegister``) once,
and :meth:`GpuDevice._upload <service.device.GpuDevice._upload>` copies a tensor that lies
in one straight to the device, asynchronously, with no staging.

When. A buffer is registered when it first goes back to the pool idle (:meth:`BodyPinner.idle`),
on a thread of this module's own, so no request waits for the pinning (it costs about as much
as writing the buffer's pages); the request that allocated it was staged, the requests that
reuse it are not. A buffer the pool lets go (evicted, reclaimed, not kept) is unregistered on
the same thread, in order, before the last reference to it goes (:meth:`BodyPinner.drop`): its
pages are never freed while registered, and a registration still queued is done or skipped
first. Only buffers of at least ``MIN_BYTES`` are pinned: below, staging costs little.

Memory. Pinned bytes are page-locked system memory; they count against the device's pinned cap
(``LU_GPU_PINNED_BYTES``, shared with the staging buffers: ``reserve`` / ``unreserve``), and a
buffer that does not fit is simply not pinned. The buffers' bytes are the body pool's own
(``LU_BODY_POOL_BYTES``, within ``LU_MAX_INFLIGHT_BYTES``): pinning allocates nothing (a buffer the
pool lets go outlives its reservation by the time its unregistration takes on the pinning thread).

Safety. A tensor is uploaded without staging only while its buffer is registered, and a lent
buffer (one a request's tensors are in) is never unregistered: only buffers the pool drops, which
are idle, are (nothing unpins at shutdown: the driver lets go of a process's pages when it exits).
The pool calls :meth:`BodyPinner.idle` and :meth:`BodyPinner.drop` under its own lock, so a buffer
it has let go cannot be pinned after. If registering fails ``FAILURES_TO_STOP`` times in a row (a
driver or container that refuses to lock pages), the pinner logs it and stops pinning; uploads go
on through the staging buffers. A buffer whose unregistration fails is kept (never freed while
its pages may still be locked) and stays counted.
"""

from __future__ import annotations

import logging
import queue
import threading
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BodyPinner"]

log = logging.getLogger("service.pinning")


@dataclass(eq=False)
class _Pin:
    buffer: np.ndarray
    reserved: bool = True  # its bytes are counted against the pinned cap
    registered: bool = False  # (read and written on the pinning thread only)
    dropped: bool = False  # the pool let go of it: unregister (if registered) and forget it


class BodyPinner:
    """Registers idle receive buffers as page-locked memory, in the background; see the module's doc.

    Parameters
    ----------
    register, unregister
        ``register(pointer, nbytes)`` and ``unregister(pointer)``: ``cudaHostRegister`` and
        ``cudaHostUnregister`` on the device (stand-ins in the tests).
    reserve, unreserve
        ``reserve(nbytes) -> bool`` takes ``nbytes`` under the pinned cap (False: no room);
        ``unreserve(nbytes)`` gives them back.
    thread_init
        Run first on the pinning thread (the device made current there).
    """

    MIN_BYTES = 1 << 20
    FAILURES_TO_STOP = 3

    def __init__(
        self,
        register: Callable[[int, int], object],
        unregister: Callable[[int], object],
        reserve: Callable[[int], bool],
        unreserve: Callable[[int], object],
        thread_init: Callable[[], object] | None = None,
    ) -> None:
        self._register, self._unregister = register, unregister
        self._reserve, self._unreserve = reserve, unreserve
        self._thread_init = thread_init
        self._lock = threading.Lock()
        self._pins: dict[int, _Pin] = {}  # id(buffer) -> its pin, for the buffers the pool holds
        self._tasks: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()  # (op, a pin or an Event)
        self._thread: threading.Thread | None = None  # started with the first task, runs for the process's life
        self._registered: list[_Pin] = []  # the pinning thread's own list
        self._stuck: list[_Pin] = []  # unregistering failed: kept, never freed (the pinning thread's own)
        # Start and end addresses of the registered buffers, sorted: replaced whole by the pinning thread,
        # read without a lock by covers() (one reference read).
        self._index: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
        self.pinned_bytes = 0  # registered now
        self._failures = 0  # registrations failed in a row
        self.failed = False  # FAILURES_TO_STOP in a row: no more pinning

    # ------------------------------------------------------------------ the pool's side

    def idle(self, buffer: np.ndarray) -> None:
        """``buffer`` went back to the pool, idle: pin it (in the background) unless it is already,
        small, or over the pinned cap. Called under the pool's lock (cheap: a lookup, a reservation, a
        queued task)."""
        if self.failed or buffer.nbytes < self.MIN_BYTES:
            return
        with self._lock:
            if id(buffer) in self._pins:
                return
            if not self._reserve(int(buffer.nbytes)):
                return
            pin = self._pins[id(buffer)] = _Pin(buffer)
        self._submit("pin", pin)

    def drop(self, buffer: np.ndarray) -> None:
        """The pool lets go of ``buffer``: unpin it first (in the background, in order; the pin holds
        the buffer until then, so its pages are not freed while registered). Under the pool's lock."""
        with self._lock:
            pin = self._pins.pop(id(buffer), None)
        if pin is not None:
            pin.dropped = True
            self._submit("unpin", pin)

    # ------------------------------------------------------------------ the upload's side

    def covers(self, a: np.ndarray) -> bool:
        """Whether ``a`` (C-contiguous) lies in one registered buffer: it can be copied to the device as it is."""
        starts, ends = self._index
        if not starts or not a.flags.c_contiguous:
            return False
        begin = a.ctypes.data
        i = bisect_right(starts, begin) - 1
        return i >= 0 and begin + a.nbytes <= ends[i]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every task queued so far is done (tests); False on timeout."""
        done = threading.Event()
        self._submit("mark", done)
        return done.wait(timeout)

    def _submit(self, op: str, item: Any) -> None:
        self._tasks.put((op, item))
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="lu-body-pinning", daemon=True)
                    try:
                        thread.start()
                    except RuntimeError:  # (can't start new thread) the task waits in the queue for a later start
                        log.exception("the body pinning thread could not start; tried again with the next task")
                        return
                    self._thread = thread

    # ------------------------------------------------------------------ the pinning thread

    def _run(self) -> None:
        if self._thread_init is not None:
            try:
                self._thread_init()
            except Exception:
                log.exception("the body pinning thread could not select the device; pinning stops")
                self.failed = True
        while True:
            op, item = self._tasks.get()
            if op == "mark":
                item.set()
                continue
            try:
                if op == "pin":
                    self._pin(item)
                else:
                    self._unpin(item)
            except Exception:  # a bug: logged; the thread goes on
                log.exception("body pinning failed on a buffer")

    def _pin(self, pin: _Pin) -> None:
        if pin.dropped or self.failed:
            if not pin.dropped:
                self._let_go(pin)  # (a dropped pin is let go by its unpin task, queued after this one)
            return
        buffer = pin.buffer
        try:
            self._register(buffer.ctypes.data, int(buffer.nbytes))
        except Exception as exc:
            self._failures += 1
            if self._failures >= self.FAILURES_TO_STOP:
                self.failed = True
                log.warning(
                    "page-locking receive buffers failed %d times in a row (%s); no more pinning, uploads go "
                    "through the staging buffers", self._failures, exc,
                )  # fmt: skip
            self._let_go(pin)  # stays in the pool unpinned; tried again the next time it goes back idle
            with self._lock:
                if self._pins.get(id(buffer)) is pin:
                    del self._pins[id(buffer)]
            return
        self._failures = 0
        pin.registered = True
        self._registered.append(pin)
        self.pinned_bytes += int(buffer.nbytes)
        self._publish()

    def _unpin(self, pin: _Pin) -> None:
        if pin.registered:
            self._registered.remove(pin)
            self._publish()  # out of the index before the pages are unlocked
            try:
                self._unregister(pin.buffer.ctypes.data)
            except Exception:
                # Its pages may still be locked: never freed, still counted (pinned_bytes, the cap).
                log.exception("unregistering a receive buffer failed; it is kept")
                self._stuck.append(pin)
                return
            pin.registered = False
            self.pinned_bytes -= int(pin.buffer.nbytes)
        self._let_go(pin)
        pin.buffer = None  # type: ignore[assignment]  # the last reference the pinner held

    def _let_go(self, pin: _Pin) -> None:
        if pin.reserved:
            pin.reserved = False
            self._unreserve(int(pin.buffer.nbytes))

    def _publish(self) -> None:
        spans = sorted((p.buffer.ctypes.data, p.buffer.ctypes.data + int(p.buffer.nbytes)) for p in self._registered)
        self._index = (tuple(s for s, _ in spans), tuple(e for _, e in spans))
