"""The in-flight memory budget: every byte held for a client is reserved here first.

``LU_MAX_INFLIGHT_BYTES`` bounds what the process holds on behalf of requests:
bodies being received, decoded tensors and their layout copies, queued and
running jobs, answers being sent, and anything kept between requests (stored
factorizations). A reservation that would pass the limit is refused at once
with 503 ``overloaded`` and ``Retry-After``, before the memory is allocated.
Nothing ever waits for room: a client that is refused retries later, so the
budget cannot become a queue that slow clients fill.

A :class:`Reservation` is shared by the parties that hold the memory it stands
for (the request in the middleware, its job on the worker): each holder calls
:meth:`Reservation.retain` and :meth:`Reservation.release`, and the bytes go
back to the budget when the last holder lets go. That keeps the accounting
right when a client disconnects while its job is still computing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from service.errors import too_large, unavailable

__all__ = ["MemoryBudget", "Reservation"]


class MemoryBudget:
    """A byte counter with a hard limit, safe to use from the event loop and worker threads."""

    def __init__(self, limit_bytes: int, *, retry_after_s: int = 1) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
        self.limit = limit_bytes
        self.retry_after_s = retry_after_s
        self._used = 0
        self._peak = 0
        self._refused = 0
        self._lock = threading.Lock()
        self._reclaimers: list[Callable[[int], int]] = []

    @property
    def in_use(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        """The most bytes reserved at once since start (for tests and /metrics)."""
        return self._peak

    @property
    def refused(self) -> int:
        return self._refused

    def add_reclaimer(self, reclaim: Callable[[int], int]) -> None:
        """Register memory that is held but may be dropped on demand (``service.bodies``' idle buffers).

        When a reservation does not fit, ``reclaim(shortfall)`` is called (outside the budget's
        lock) and gives back what it can; then the reservation is tried once more.
        """
        self._reclaimers.append(reclaim)

    def _try(self, nbytes: int) -> int:
        """Take ``nbytes`` (returns 0) or take nothing and return the shortfall."""
        if nbytes < 0:
            raise ValueError(f"cannot reserve a negative number of bytes ({nbytes})")
        with self._lock:
            short = self._used + nbytes - self.limit
            if short > 0:
                return short
            self._used += nbytes
            self._peak = max(self._peak, self._used)
            return 0

    def _take(self, nbytes: int) -> bool:
        short = self._try(nbytes)
        if short and self._reclaimers:
            for reclaim in self._reclaimers:
                short -= reclaim(short)
                if short <= 0:
                    break
            short = self._try(nbytes)
        if short:
            with self._lock:
                self._refused += 1
            return False
        return True

    def take_quietly(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit now, reclaiming nothing and counting no refusal (memory kept by choice)."""
        return self._try(nbytes) == 0

    def give(self, nbytes: int) -> None:
        """Give back bytes taken with :meth:`take_quietly`."""
        self._give(nbytes)

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self._used -= nbytes

    def _refusal(self, nbytes: int, what: str) -> Exception:
        return unavailable(
            "overloaded",
            f"{what} needs {nbytes} bytes of memory and the service holds {self._used} of its "
            f"LU_MAX_INFLIGHT_BYTES = {self.limit} for other requests; retry later",
            self.retry_after_s,
        )

    def try_reserve(self, nbytes: int) -> Reservation | None:
        """A reservation of ``nbytes``, or ``None`` when it would pass the limit."""
        return Reservation(self, nbytes) if self._take(nbytes) else None

    def reserve(self, nbytes: int, what: str = "this request") -> Reservation:
        """A reservation of ``nbytes``; 503 ``overloaded`` (a ``ServiceError``) when it would pass the limit now,
        413 ``request_too_large`` when it never could (retrying would not help)."""
        if nbytes > self.limit:
            raise too_large(
                "request_too_large",
                f"{what} needs {nbytes} bytes of memory, more than LU_MAX_INFLIGHT_BYTES = {self.limit} "
                "allows for all requests together; send a smaller one",
            )
        reservation = self.try_reserve(nbytes)
        if reservation is None:
            raise self._refusal(nbytes, what)
        return reservation


class Reservation:
    """Bytes held against a :class:`MemoryBudget` until the last holder releases them."""

    def __init__(self, budget: MemoryBudget, nbytes: int) -> None:
        self._budget = budget
        self._lock = threading.Lock()
        self.nbytes = nbytes
        self._holders = 1
        self._on_release: list[Callable[[], None]] = []

    def grow(self, extra: int, what: str = "this request") -> None:
        """Reserve ``extra`` more bytes (503 ``overloaded`` when they do not fit now, 413 when they never could)."""
        if extra == 0:
            return
        if self.nbytes + extra > self._budget.limit:
            self._budget.reserve(self.nbytes + extra, what)  # raises the 413 that says so
        if not self._budget._take(extra):
            raise self._budget._refusal(extra, what)
        with self._lock:
            if self._holders == 0:  # released meanwhile: nothing would give these back
                self._budget._give(extra)
                return
            self.nbytes += extra

    def retain(self) -> Reservation:
        """One more holder (e.g. a job on the worker); each holder releases once."""
        with self._lock:
            if self._holders == 0:
                raise RuntimeError("retain() after the reservation was released")
            self._holders += 1
        return self

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the last holder has let go (at once if that has happened already).

        For what lives exactly as long as the reservation's holders use it: a request body's
        pooled buffer (``service.bodies``), whose tensors the request and its job both read.
        """
        with self._lock:
            if self._holders:
                self._on_release.append(callback)
                return
        callback()

    def release(self) -> None:
        """Let go; the bytes return to the budget when the last holder has let go. Idempotent past zero."""
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders:
                return
            nbytes, self.nbytes = self.nbytes, 0
            callbacks, self._on_release = self._on_release, []
        self._budget._give(nbytes)
        for callback in callbacks:
            callback()

    @property
    def released(self) -> bool:
        return self._holders == 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
