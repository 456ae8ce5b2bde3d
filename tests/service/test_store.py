"""The factorization store on its own: LRU order, idle expiry (injected clock), pins, namespaces, accounting."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

from service.errors import ServiceError
from service.store import ENTRY_OVERHEAD_BYTES, Entry, FactorizationStore, check_name, namespace_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reservations:
    """Records reserve/release pairs, as the service's MemoryBudget would see them."""

    def __init__(self) -> None:
        self.in_use = 0
        self.lock = threading.Lock()

    def reserve(self, nbytes: int, what: str):
        budget = self
        with self.lock:
            self.in_use += nbytes

        class _R:
            released = False

            def release(self) -> None:
                with budget.lock:
                    if not self.released:
                        self.released = True
                        budget.in_use -= nbytes

        return _R()


def entry(store: FactorizationStore, name: str, n: int = 4, namespace: str = "", value: float = 1.0) -> Entry:
    LU = np.full((n, n), value)
    piv = np.arange(1, n + 1, dtype=np.int32)
    nbytes = LU.nbytes + piv.nbytes
    return Entry(
        namespace, name, LU, piv, np.zeros((), np.int32), True, LU.shape, "float64", nbytes, 0.0,
        reservation=store.reserve(nbytes),
    )  # fmt: skip


SIZE = 4 * 4 * 8 + 4 * 4 + ENTRY_OVERHEAD_BYTES  # one 4x4 entry, counted with its bookkeeping


def make(limit_entries: float = 3, ttl: float = 0, budget=None) -> tuple[FactorizationStore, Clock]:
    clock = Clock()
    return FactorizationStore(int(limit_entries * SIZE), ttl, budget=budget, clock=clock), clock


def present(store: FactorizationStore, namespace: str = "") -> list[str]:
    return sorted(e.name for e in store.names(namespace))


def test_least_recently_used_is_evicted_first():
    store, clock = make(3)
    for name in "abc":
        store.put(entry(store, name))
        clock.now += 1
    store.pin("", "a").release()  # a solve uses a: b is now the least recently used
    store.get("", "b")  # metadata is not a use
    created, evicted = store.put(entry(store, "d"))
    assert created and [e.name for e in evicted] == ["b"]
    assert present(store) == ["a", "c", "d"]
    _, evicted = store.put(entry(store, "e"))
    assert [e.name for e in evicted] == ["c"]
    assert store.stats.evictions == 2 and store.stats.bytes == 3 * SIZE and store.stats.entries == 3
    with pytest.raises(ServiceError) as exc:
        store.pin("", "b")
    assert exc.value.status == 404 and exc.value.code == "unknown_factorization"


def test_a_bigger_entry_evicts_as_many_as_needed_and_a_too_big_one_evicts_nothing():
    store, _ = make(3)
    for name in "abc":
        store.put(entry(store, name))
    big = Entry("", "big", np.zeros((5, 5)), np.arange(1, 6, dtype=np.int32), None, True, (5, 5), "float64",
                200 + 20, 0.0)  # fmt: skip
    _, evicted = store.put(big)
    assert [e.name for e in evicted] == ["a", "b"] and present(store) == ["big", "c"]
    with pytest.raises(ServiceError) as exc:
        store.reserve(3 * SIZE + 1)
    assert exc.value.status == 413 and exc.value.code == "factorization_too_large"
    assert "LU_STORE_BYTES" in exc.value.message and "nothing was evicted" in exc.value.message
    assert present(store) == ["big", "c"] and store.stats.evictions == 2


def test_idle_entries_expire_and_use_keeps_them_alive():
    store, clock = make(10, ttl=100)
    store.put(entry(store, "a"))
    store.put(entry(store, "b"))
    clock.now += 60
    store.pin("", "a").release()
    assert store.expires_in(store.get("", "a")) == pytest.approx(100)
    assert store.expires_in(store.get("", "b")) == pytest.approx(40)
    clock.now += 50  # b idle 110 s, a idle 50 s
    assert present(store) == ["a"]
    assert store.stats.expiries == 1 and store.stats.bytes == SIZE
    clock.now += 100
    assert store.expire() == 1 and present(store) == [] and store.stats.expiries == 2
    with pytest.raises(ServiceError):
        store.get("", "a")


def test_zero_ttl_never_expires():
    store, clock = make(10, ttl=0)
    store.put(entry(store, "a"))
    clock.now += 1e9
    assert present(store) == ["a"] and store.expires_in(store.get("", "a")) is None


def test_replace_is_atomic_and_pins_keep_memory_until_released():
    budget = Reservations()
    store, _ = make(10, budget=budget)
    old = entry(store, "x", value=1.0)
    store.put(old)
    pin = store.pin("", "x")
    assert pin.begin()  # a solve is running on the old entry
    new = entry(store, "x", value=2.0)
    created, _ = store.put(new)
    assert not created
    later = store.pin("", "x")
    assert later.entry is new  # later solves see the new one
    later.abandon()
    assert not old.freed and old.LU is not None and float(old.LU[0, 0]) == 1.0  # not freed under the solve
    data = SIZE - ENTRY_OVERHEAD_BYTES  # held_bytes: the arrays alone (a GPU's device memory), old and new
    assert store.stats.bytes == SIZE and store.held_bytes == 2 * data
    assert budget.in_use == 2 * SIZE  # the old entry's reservation is still held
    pin.release()
    assert old.freed and old.LU is None and budget.in_use == SIZE and store.stats.freed_late == 1
    store.delete("", "x")
    assert new.freed and budget.in_use == 0 and store.held_bytes == 0


def test_delete_under_a_running_solve_frees_after_it():
    budget = Reservations()
    store, _ = make(10, budget=budget)
    e = entry(store, "x")
    store.put(e)
    pin = store.pin("", "x")
    assert pin.begin()
    store.delete("", "x")
    with pytest.raises(ServiceError):
        store.pin("", "x")  # gone for everyone else at once
    assert not e.freed and budget.in_use == SIZE
    pin.abandon()  # the route stops waiting: the running job still owns the pin
    assert not e.freed
    pin.release()
    pin.release()  # idempotent
    assert e.freed and budget.in_use == 0 and e.pins == 0


def test_a_job_abandoned_before_it_began_never_runs():
    store, _ = make(10)
    e = entry(store, "x")
    store.put(e)
    pin = store.pin("", "x")
    pin.abandon()
    assert not pin.begin() and e.pins == 0
    store.delete("", "x")
    assert e.freed


def test_namespaces_are_separate():
    store, _ = make(10)
    k1, k2 = namespace_of(b"key-one"), namespace_of(b"key-two")
    assert k1 != k2 and namespace_of(None) == "" and b"key-one".hex() not in k1
    store.put(entry(store, "x", namespace=k1, value=1.0))
    with pytest.raises(ServiceError):
        store.get(k2, "x")
    with pytest.raises(ServiceError):
        store.delete(k2, "x")
    store.put(entry(store, "x", namespace=k2, value=2.0))
    assert float(store.get(k1, "x").LU[0, 0]) == 1.0 and float(store.get(k2, "x").LU[0, 0]) == 2.0
    assert present(store, k1) == ["x"] and present(store, "") == []


def test_clear_frees_everything():
    budget = Reservations()
    store, _ = make(10, budget=budget)
    for name in "abc":
        store.put(entry(store, name))
    store.clear()
    assert budget.in_use == 0 and store.stats.bytes == 0 and store.stats.entries == 0


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "x" * 128, "..a", "-"])
def test_valid_names(name):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 129, "a b", "a/b", "ä", ".", "..", "a*", "a\x00", "a\n"])
def test_invalid_names(name):
    with pytest.raises(ServiceError) as exc:
        check_name(name)
    assert exc.value.status == 422 and exc.value.code == "invalid_name"


def test_concurrent_pins_and_replaces_keep_the_books_balanced():
    budget = Reservations()
    store, _ = make(4, budget=budget)
    errors = []

    def solver() -> None:
        for _ in range(300):
            try:
                pin = store.pin("", "x")
            except ServiceError:
                continue
            try:
                assert pin.begin()
                value = float(pin.entry.LU[0, 0])  # never freed while pinned (None would raise)
                assert np.all(value == pin.entry.LU)
            except Exception as exc:  # threads cannot fail the test themselves
                errors.append(repr(exc))
            finally:
                pin.release()

    def writer() -> None:
        for i in range(300):
            if i % 7 == 6:
                with contextlib.suppress(ServiceError):
                    store.delete("", "x")
            else:
                store.put(entry(store, "x", value=float(i)))

    threads = [threading.Thread(target=solver) for _ in range(3)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store.clear()
    assert budget.in_use == 0 and store.held_bytes == 0


def test_the_entry_cap_evicts_in_the_callers_namespace_first():
    """Many small entries under one key do not push out another key's: past LU_STORE_MAX_ENTRIES, the least
    recently used entry of the caller's own namespace goes first (bytes over the limit evict by recency)."""
    clock = Clock()
    store = FactorizationStore(1 << 30, 0, max_entries=4, clock=clock)
    for name in "ab":
        store.put(entry(store, name, namespace="alice"))
        clock.now += 1
    for i in range(50):  # bob fills the cap over and over
        store.put(entry(store, f"b{i}", namespace="bob"))
        clock.now += 1
    assert present(store, "alice") == ["a", "b"] and present(store, "bob") == ["b48", "b49"]
    store.put(entry(store, "c", namespace="carol"))  # a key with nothing stored evicts the oldest of all
    assert present(store, "alice") == ["b"] and present(store, "carol") == ["c"]
    assert store.stats.entries == 4
