"""Stored factorizations: factor once, solve many times, where the worker computes.

A :class:`FactorizationStore` maps ``(namespace, name)`` to an immutable
:class:`Entry` holding ``LU`` and ``pivots`` as the device keeps them (CuPy arrays
on a GPU, NumPy on the CPU). The namespace is derived from the caller's API key,
so one key never sees another's names.

Why entries are immutable and pinned
    A replace builds a whole new entry and swaps it in under the lock; a delete,
    an eviction or an expiry only removes the entry from the map. A solve takes a
    :class:`Pin` on the entry it found and computes with that entry's arrays to
    the end, so it answers with the old or the new factorization, never a mixture.
    An entry that leaves the map while pinned keeps its memory (and its
    reservation against the service's memory budget) until the last pin goes;
    only then is the reservation released and the arrays dropped.

Bounds
    ``limit_bytes`` (``LU_STORE_BYTES``) bounds the bytes of the entries in the
    map, each counted with :data:`ENTRY_OVERHEAD_BYTES` of bookkeeping beside its
    arrays (so that empty or tiny factorizations cannot grow the store without
    bound), and ``max_entries`` (``LU_STORE_MAX_ENTRIES``) their number (so that a
    listing stays bounded); inserting beyond either evicts the least recently used
    entries. One entry larger than the whole limit is refused before anything is computed.
    ``ttl_s`` (``LU_STORE_TTL_S``) expires entries idle for that long (0: never).
    Since the map is kept in order of last use, the idle ones are at its front.

Every method is thread-safe (one lock); none blocks on the device.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from service.errors import ServiceError, invalid

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "NAME_PATTERN",
    "Entry",
    "FactorizationStore",
    "Pin",
    "StoreStats",
    "check_name",
    "namespace_of",
    "unknown_factorization",
]

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")

#: Host memory an entry takes beyond its arrays (the entry, its key and name, the array and ``info``
#: objects): about 1.6 KB measured for a 0 x 0 factorization under a 100-character name (5000 of them
#: grew the process by 8.1 MB). Counted against ``LU_STORE_BYTES`` and reserved with the entry.
ENTRY_OVERHEAD_BYTES = 2048


class Reservation(Protocol):
    def release(self) -> None: ...


class Budget(Protocol):
    """The part of ``service.budget.MemoryBudget`` the store uses."""

    def reserve(self, nbytes: int, what: str) -> Reservation: ...


def check_name(name: str) -> str:
    """``name`` if it is 1-128 characters of ``[A-Za-z0-9._-]``, else 422 ``invalid_name``."""
    if NAME_PATTERN.fullmatch(name) is None or name in (".", ".."):
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise invalid(
            "invalid_name",
            f"factorization name {shown!r} is invalid: use 1 to 128 characters of A-Z a-z 0-9 . _ - "
            "(and not '.' or '..', which URLs collapse)",
        )
    return name


def namespace_of(api_key: bytes | None) -> str:
    """The namespace of a caller: a digest of its API key (the key itself is never kept); '' without keys."""
    if not api_key:
        return ""
    return hashlib.sha256(b"lu-service store namespace\0" + api_key).hexdigest()[:32]


def unknown_factorization(name: str) -> ServiceError:
    return ServiceError(
        404,
        "unknown_factorization",
        f"no factorization named {name!r}: it was never stored under this API key, or it was deleted, "
        "expired or evicted (factorizations live in one replica's memory and are lost on restart)",
    )


@dataclass(eq=False)
class Entry:
    """One stored factorization; its arrays are never modified after creation."""

    namespace: str
    name: str
    LU: Any
    pivots: Any
    info: Any  # on the host: small, and answered with the metadata
    pivot: bool
    shape: tuple[int, ...]
    dtype: str
    nbytes: int  # LU and pivots (the metadata's nbytes; on a GPU, device memory)
    created_at: float  # wall clock, for the metadata
    reservation: Reservation | None = None
    last_used: float = 0.0  # the store's clock
    pins: int = 0
    stored: bool = True  # False once deleted, replaced, evicted or expired
    freed: bool = False

    @property
    def held(self) -> int:
        """What the entry counts against ``LU_STORE_BYTES``: its arrays and its bookkeeping."""
        return self.nbytes + ENTRY_OVERHEAD_BYTES


@dataclass
class StoreStats:
    """Counters for ``/metrics`` (monotonic except ``bytes`` and ``entries``)."""

    bytes: int = 0  # of the stored entries, bookkeeping included (Entry.held)
    entries: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    expiries: int = 0
    freed_late: int = 0  # removed entries whose memory waited for a running solve


class Pin:
    """A running solve's hold on an entry: the entry's memory stays until the pin is released.

    ``begin`` is called on the worker thread when the job starts; ``release`` when it
    ends; ``abandon`` by the route when it stops waiting. Whichever of ``release`` and
    ``abandon`` comes first unpins, once; a job abandoned before it began does not run.
    """

    def __init__(self, store: FactorizationStore, entry: Entry) -> None:
        self.entry = entry
        self._store = store
        self._lock = threading.Lock()
        self._state = "held"  # held -> running -> done, or held -> done

    def begin(self) -> bool:
        with self._lock:
            if self._state != "held":
                return False
            self._state = "running"
            return True

    def release(self) -> None:
        with self._lock:
            if self._state == "done":
                return
            self._state = "done"
        self._store._unpin(self.entry)

    def abandon(self) -> None:
        """Unpin unless the job is running (then the worker releases when it ends)."""
        with self._lock:
            if self._state != "held":
                return
            self._state = "done"
        self._store._unpin(self.entry)


class FactorizationStore:
    """LRU map of factorizations per namespace, bounded in bytes, with idle expiry.

    Parameters
    ----------
    limit_bytes : int
        Most bytes held by stored entries (``LU`` + ``pivots`` + :data:`ENTRY_OVERHEAD_BYTES` each).
    ttl_s : float
        Idle time after which an entry expires; 0 disables expiry.
    max_entries : int
        Most entries stored (all namespaces together).
    budget : MemoryBudget, optional
        The service's memory accounting: each entry holds a reservation of its bytes
        until its memory is freed.
    clock : callable, optional
        Monotonic seconds (tests inject one to expire entries without sleeping).
    """

    def __init__(
        self,
        limit_bytes: int,
        ttl_s: float,
        *,
        max_entries: int = 10_000,
        budget: Budget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.budget = budget
        self.clock = clock
        self.stats = StoreStats()
        self._lock = threading.Lock()
        # (namespace, name) -> entry, least recently used first.
        self._entries: OrderedDict[tuple[str, str], Entry] = OrderedDict()
        # Removed from the map while a solve still used them: freed by the last unpin.
        self._pinned_removed: set[Entry] = set()

    # ------------------------------------------------------------------ admission

    def check_fits(self, nbytes: int) -> None:
        """Refuse (413 ``factorization_too_large``) a factorization of ``nbytes`` (``LU`` + ``pivots``) the
        store could never hold."""
        if nbytes + ENTRY_OVERHEAD_BYTES > self.limit_bytes or self.max_entries < 1:
            raise ServiceError(
                413,
                "factorization_too_large",
                f"the factorization would take {nbytes + ENTRY_OVERHEAD_BYTES} bytes ({nbytes} of LU and pivots, "
                f"{ENTRY_OVERHEAD_BYTES} of bookkeeping), more than the whole store (LU_STORE_BYTES = "
                f"{self.limit_bytes}, LU_STORE_MAX_ENTRIES = {self.max_entries}); it is not stored, and nothing "
                "was evicted",
            )

    def reserve(self, nbytes: int) -> Reservation | None:
        """A reservation against the service's memory budget for an entry of ``nbytes`` (``LU`` + ``pivots``)
        and its bookkeeping (503 ``overloaded`` when full)."""
        self.check_fits(nbytes)
        if self.budget is None:
            return None
        return self.budget.reserve(nbytes + ENTRY_OVERHEAD_BYTES, "stored factorization")

    # ------------------------------------------------------------------ changes

    def put(self, entry: Entry) -> tuple[bool, list[Entry]]:
        """Store ``entry``, replacing one of the same name atomically.

        Returns whether the name was new, and the entries evicted to make room.
        """
        self.check_fits(entry.nbytes)
        to_free: list[Entry] = []
        with self._lock:
            now = self.clock()
            self._expire_locked(now, to_free)
            key = (entry.namespace, entry.name)
            old = self._entries.pop(key, None)
            if old is not None:
                self._drop_locked(old, to_free)
            evicted: list[Entry] = []
            while self._entries and (
                self.stats.bytes + entry.held > self.limit_bytes or len(self._entries) >= self.max_entries
            ):
                over_bytes = self.stats.bytes + entry.held > self.limit_bytes
                victim = self._entries.pop(self._victim_locked(None if over_bytes else entry.namespace))
                self._drop_locked(victim, to_free)
                evicted.append(victim)
                self.stats.evictions += 1
            entry.last_used = now
            self._entries[key] = entry
            self.stats.bytes += entry.held
            self.stats.entries = len(self._entries)
        self._free(to_free)
        return old is None, evicted

    def delete(self, namespace: str, name: str) -> None:
        """Remove a factorization (404 ``unknown_factorization`` when absent)."""
        to_free: list[Entry] = []
        with self._lock:
            self._expire_locked(self.clock(), to_free)
            entry = self._entries.pop((namespace, name), None)
            if entry is None:
                self.stats.misses += 1
            else:
                self._drop_locked(entry, to_free)
                self.stats.entries = len(self._entries)
        self._free(to_free)
        if entry is None:
            raise unknown_factorization(name)

    def expire(self) -> int:
        """Drop every idle-expired entry now; returns how many."""
        to_free: list[Entry] = []
        with self._lock:
            count = self._expire_locked(self.clock(), to_free)
        self._free(to_free)
        return count

    def clear(self) -> None:
        """Drop everything (shutdown)."""
        to_free: list[Entry] = []
        with self._lock:
            while self._entries:
                _, entry = self._entries.popitem(last=False)
                self._drop_locked(entry, to_free)
            self.stats.entries = 0
        self._free(to_free)

    # ------------------------------------------------------------------ reads

    def pin(self, namespace: str, name: str) -> Pin:
        """The entry for a solve, pinned and marked as used (404 when absent)."""
        return Pin(self, self._lookup(namespace, name, pin=True))

    def get(self, namespace: str, name: str) -> Entry:
        """The entry for its metadata; not a use (the idle clock and LRU order are untouched)."""
        return self._lookup(namespace, name, pin=False)

    def names(self, namespace: str) -> list[Entry]:
        """The namespace's entries, most recently used first."""
        to_free: list[Entry] = []
        with self._lock:
            self._expire_locked(self.clock(), to_free)
            found = [e for (ns, _), e in reversed(self._entries.items()) if ns == namespace]
        self._free(to_free)
        return found

    def expires_in(self, entry: Entry) -> float | None:
        """Seconds until ``entry`` expires if left idle (None: never)."""
        if self.ttl_s <= 0:
            return None
        return max(0.0, entry.last_used + self.ttl_s - self.clock())

    @property
    def held_bytes(self) -> int:
        """Bytes of arrays (``LU`` + ``pivots``: on a GPU, device memory) not yet freed: stored entries plus
        removed ones still pinned; bookkeeping not included."""
        with self._lock:
            stored = self.stats.bytes - ENTRY_OVERHEAD_BYTES * len(self._entries)
            return stored + sum(e.nbytes for e in self._pinned_removed)

    # ------------------------------------------------------------------ internals

    def _lookup(self, namespace: str, name: str, *, pin: bool) -> Entry:
        to_free: list[Entry] = []
        with self._lock:
            now = self.clock()
            self._expire_locked(now, to_free)
            key = (namespace, name)
            entry = self._entries.get(key)
            if entry is None:
                self.stats.misses += 1
            else:
                self.stats.hits += 1
                if pin:
                    entry.pins += 1
                    entry.last_used = now
                    self._entries.move_to_end(key)
        self._free(to_free)
        if entry is None:
            raise unknown_factorization(name)
        return entry

    def _victim_locked(self, namespace: str | None) -> tuple[str, str]:
        """The key to evict: the least recently used entry, of ``namespace`` where it holds one. The entry
        cap evicts in the caller's own namespace first, so that one API key's many small factorizations
        cannot push out every other key's (bytes over LU_STORE_BYTES evict by recency alone)."""
        if namespace is not None:
            for key in self._entries:  # (a PUT past the cap: at most one walk of the map)
                if key[0] == namespace:
                    return key
        return next(iter(self._entries))

    def _expire_locked(self, now: float, to_free: list[Entry]) -> int:
        if self.ttl_s <= 0:
            return 0
        count = 0
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.last_used < self.ttl_s:
                break  # in order of last use: the rest are younger
            del self._entries[key]
            self._drop_locked(entry, to_free)
            self.stats.expiries += 1
            count += 1
        self.stats.entries = len(self._entries)
        return count

    def _drop_locked(self, entry: Entry, to_free: list[Entry]) -> None:
        """Take ``entry`` out of the accounting of stored bytes; free it now unless pinned."""
        entry.stored = False
        self.stats.bytes -= entry.held
        if entry.pins == 0:
            to_free.append(entry)
        else:
            self._pinned_removed.add(entry)

    def _unpin(self, entry: Entry) -> None:
        to_free: list[Entry] = []
        with self._lock:
            entry.pins -= 1
            if entry.pins == 0 and not entry.stored and entry in self._pinned_removed:
                self._pinned_removed.discard(entry)
                self.stats.freed_late += 1
                to_free.append(entry)
        self._free(to_free)

    def _free(self, entries: list[Entry]) -> None:
        # Outside the lock: dropping a CuPy array returns its block to the pool.
        for entry in entries:
            if entry.freed:
                continue
            entry.freed = True
            entry.LU = entry.pivots = None
            if entry.reservation is not None:
                entry.reservation.release()
