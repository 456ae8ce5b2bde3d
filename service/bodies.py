"""Receive buffers for request bodies, reused across requests (``LU_BODY_POOL_BYTES``).

Why: a fresh 128 MiB buffer per request costs a page fault per 4 KiB page as its
bytes arrive (~32,000 per request) and an ``munmap`` when it is freed; that made
receiving a big binary body cost 2-3.6x a plain loopback copy of the same bytes.
A buffer that has been used before is already resident: the copy is all that is left.

Lifetime. A binary body is decoded into views (``np.frombuffer``): the tensors a
route computes on *are* the buffer. So a buffer may be handed to another request
only once nothing uses the first request's tensors any longer, and that is later
than the request's end when its client leaves while its job computes
(``service.worker`` keeps running it). Each buffer is lent as a :class:`BodyLease`
(refcounted: :meth:`BodyLease.retain` / :meth:`BodyLease.release`, like
``service.budget.Reservation``). ``transport.read_body`` ties the lease to the
request's memory reservation (``Reservation.on_release``), whose holders are
exactly the parties that may touch the tensors: the request (released by
``service.middleware`` once the answer is sent or the client has gone) and its job
(released by the worker when the job ends or is dropped). The buffer goes back to
the pool when the last of them lets go, never before.

Sizes. Buffers come in size classes a quarter of an octave apart (64 KiB, 80, 96,
112, 128, 160, ... KiB): a request takes an idle buffer of its own class only, so
a small request never pins a 256 MiB buffer, and a buffer is at most 25% larger
than the body it holds. Bodies under 64 KiB are not pooled (``malloc`` serves them
from its heap without page faults).

Memory. The pool keeps at most ``LU_BODY_POOL_BYTES`` idle, and every byte it keeps
is reserved against ``LU_MAX_INFLIGHT_BYTES`` (``service.budget``): an idle buffer's
whole capacity, and for a lent one the slack between its capacity and the body
(the body's own bytes are in the request's reservation). When a request's
reservation would not fit, the budget first asks the pool to drop idle buffers
(:meth:`BodyPool.reclaim`), so idle buffers never cause a 503; and a buffer is
kept idle only when the budget has room for it, else it is freed.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from service.budget import MemoryBudget
from service.pinning import BodyPinner

__all__ = ["MIN_POOLED", "BodyLease", "BodyPool", "size_class"]

log = logging.getLogger("service.bodies")

# Below this a body is not pooled: malloc serves it from its heap, with no page faults to save.
MIN_POOLED = 64 << 10


def size_class(nbytes: int) -> int:
    """The capacity of the buffer that holds ``nbytes``: ``nbytes`` rounded up to a quarter-octave step.

    >>> [size_class(n) for n in (65536, 65537, 98304, 131072, 131073)]
    [65536, 81920, 98304, 131072, 163840]
    """
    if nbytes <= MIN_POOLED:
        return MIN_POOLED
    step = 1 << ((nbytes - 1).bit_length() - 3)
    return -(-nbytes // step) * step


@dataclass
class PoolStats:
    """Counters since start (for tests and the bench): lent from idle, freshly allocated, freed, reclaimed bytes."""

    hits: int = 0
    misses: int = 0
    unpooled: int = 0
    dropped: int = 0
    reclaimed_bytes: int = 0


class BodyLease:
    """One body's buffer, lent until its last holder releases it.

    ``view`` is exactly the body's length (a pooled buffer may be longer; its tail is never
    exposed). Not thread-confined: the worker thread may release the last hold.
    """

    def __init__(self, pool: BodyPool | None, buffer: np.ndarray, size: int, reused: bool = False) -> None:
        self._pool = pool
        self.reused = reused  # a buffer that held a body before: its pages are resident
        self._buffer: np.ndarray | None = buffer
        self.size = size
        self.capacity = int(buffer.nbytes)
        self.view = memoryview(buffer)[:size]
        self._holders = 1
        self._lock = threading.Lock()

    @property
    def pooled(self) -> bool:
        """Whether the buffer goes back to a pool when the last holder lets go."""
        return self._pool is not None

    @property
    def released(self) -> bool:
        return self._holders == 0

    def retain(self) -> BodyLease:
        """One more holder; each holder releases once."""
        with self._lock:
            if self._holders == 0:
                raise RuntimeError("retain() after the lease was released")
            self._holders += 1
        return self

    def release(self) -> None:
        """Let go; the buffer returns to the pool when the last holder has. Idempotent past zero."""
        with self._lock:
            if self._holders == 0:
                return
            self._holders -= 1
            if self._holders:
                return
            buffer, self._buffer = self._buffer, None
        if self._pool is not None and buffer is not None:
            self._pool._give_back(buffer, self.size)


class BodyPool:
    """Idle receive buffers by size class, at most ``idle_limit`` bytes, reserved against ``budget``.

    Parameters
    ----------
    idle_limit
        Most bytes kept idle (``LU_BODY_POOL_BYTES``); 0 pools nothing.
    budget
        The service's memory budget; the pool reserves what it keeps and gives it back on
        :meth:`reclaim`. ``None`` (tests) reserves nothing.
    pinner
        On a GPU (:meth:`service.device.Device.body_pinner`): told of each buffer that goes back
        idle (to page-lock it, so that later bodies in it are uploaded without staging) and of each
        buffer the pool lets go (to unlock it first). ``None``: nothing pinned.
    """

    def __init__(self, idle_limit: int, budget: MemoryBudget | None = None, pinner: BodyPinner | None = None) -> None:
        if idle_limit < 0:
            raise ValueError(f"idle_limit must be >= 0, got {idle_limit}")
        self.idle_limit = idle_limit
        self._budget = budget
        self.pinner = pinner
        self._lock = threading.Lock()
        # Idle buffers, least recently returned first (for eviction), and by class (for lending).
        self._order: OrderedDict[int, np.ndarray] = OrderedDict()
        self._by_class: dict[int, list[np.ndarray]] = {}
        self._idle_bytes = 0
        self._held = 0  # bytes this pool has reserved in the budget: idle capacity + lent buffers' slack
        self.stats = PoolStats()
        if budget is not None:
            budget.add_reclaimer(self.reclaim)

    @property
    def idle_bytes(self) -> int:
        return self._idle_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes the pool holds reserved against the budget (idle buffers, and slack of lent ones)."""
        return self._held

    def take(self, size: int) -> BodyLease:
        """A lease on a buffer of at least ``size`` bytes (its ``view`` exactly ``size``), uninitialised.

        An idle buffer of ``size``'s class when there is one; else a fresh one, pooled when the
        budget has room for its slack, else exactly ``size`` and not pooled. A fresh buffer is
        ``np.empty``: its pages become resident only as bytes are written into it.
        """
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if size < MIN_POOLED or self.idle_limit == 0:
            self.stats.unpooled += 1
            return BodyLease(None, np.empty(size, np.uint8), size)
        capacity = size_class(size)
        with self._lock:
            shelf = self._by_class.get(capacity)
            buffer = shelf.pop() if shelf else None
            if buffer is not None:
                del self._order[id(buffer)]
                self._idle_bytes -= capacity
                # The body's bytes pass to the request's reservation; the pool keeps the slack.
                self._held -= size
                self.stats.hits += 1
        if buffer is not None:
            self._give(size)
            return BodyLease(self, buffer, size, reused=True)
        if capacity > self.idle_limit or not self._take(capacity - size):
            self.stats.unpooled += 1
            return BodyLease(None, np.empty(size, np.uint8), size)
        with self._lock:
            self._held += capacity - size
            self.stats.misses += 1
        return BodyLease(self, np.empty(capacity, np.uint8), size)

    def _give_back(self, buffer: np.ndarray, size: int) -> None:
        """A lease's last holder let go: keep the buffer idle if the limit and the budget allow, else free it."""
        capacity = int(buffer.nbytes)
        evicted: list[np.ndarray] = []
        keep = capacity <= self.idle_limit and self._take(size)
        with self._lock:
            if keep:
                while self._idle_bytes + capacity > self.idle_limit:
                    evicted.append(self._evict_oldest())
                self._order[id(buffer)] = buffer
                self._by_class.setdefault(capacity, []).append(buffer)
                self._idle_bytes += capacity
                self._held += size
            else:
                self._held -= capacity - size
                self.stats.dropped += 1
            freed = sum(int(b.nbytes) for b in evicted)
            self._held -= freed
            self.stats.dropped += len(evicted)
            self._tell_pinner(evicted if keep else [*evicted, buffer], buffer if keep else None)
        self._give(freed + (0 if keep else capacity - size))

    def _evict_oldest(self) -> np.ndarray:
        # Under self._lock.
        _, buffer = self._order.popitem(last=False)
        capacity = int(buffer.nbytes)
        _remove_identical(self._by_class[capacity], buffer)
        self._idle_bytes -= capacity
        return buffer

    def reclaim(self, nbytes: int) -> int:
        """Free idle buffers, oldest first, until ``nbytes`` are given back to the budget or none is left.

        Called by the budget when a reservation does not fit; returns the bytes given back.
        """
        freed = 0
        evicted: list[np.ndarray] = []
        with self._lock:
            while freed < nbytes and self._order:
                evicted.append(self._evict_oldest())
                freed += int(evicted[-1].nbytes)
            self._held -= freed
            self.stats.reclaimed_bytes += freed
            self._tell_pinner(evicted, None)
        self._give(freed)
        return freed

    def clear(self) -> None:
        """Free every idle buffer (shutdown, tests)."""
        self.reclaim(self._idle_bytes)

    def _tell_pinner(self, dropped: list[np.ndarray], kept: np.ndarray | None) -> None:
        """Under ``_lock``, so that a buffer let go here cannot be pinned by a concurrent give-back after.
        Pinning only speeds uploads up: a failure in it is logged, never lets the pool's accounting down."""
        if self.pinner is None:
            return
        calls = [(self.pinner.drop, b) for b in dropped]
        if kept is not None:
            calls.append((self.pinner.idle, kept))
        for call, buffer in calls:  # each on its own: one failing does not leave the others untold
            try:
                call(buffer)
            except Exception:
                log.exception("telling the body pinner failed; the pool goes on")

    def _take(self, nbytes: int) -> bool:
        return self._budget is None or self._budget.take_quietly(nbytes)

    def _give(self, nbytes: int) -> None:
        if self._budget is not None and nbytes:
            self._budget.give(nbytes)


def _remove_identical(shelf: list[np.ndarray], buffer: np.ndarray) -> None:
    # list.remove compares arrays with ==; identity is what is meant.
    for i, b in enumerate(shelf):
        if b is buffer:
            del shelf[i]
            return
