"""MemoryBudget and Reservation: the accounting every request and stored factorization goes through."""

from __future__ import annotations

import threading

import pytest

from service.budget import MemoryBudget
from service.errors import ServiceError


def test_reserve_release_and_peak():
    budget = MemoryBudget(100, retry_after_s=3)
    a = budget.reserve(60)
    assert budget.in_use == 60
    with pytest.raises(ServiceError) as refused:
        budget.reserve(50)
    assert refused.value.status == 503 and refused.value.code == "overloaded"
    assert refused.value.headers["Retry-After"] == "3"
    assert budget.try_reserve(50) is None and budget.refused == 2
    a.release()
    a.release()  # idempotent
    assert budget.in_use == 0 and budget.peak == 60


def test_more_than_the_whole_budget_is_413_not_503():
    budget = MemoryBudget(100)
    with pytest.raises(ServiceError) as refused:
        budget.reserve(101)
    assert refused.value.status == 413 and refused.value.code == "request_too_large"
    r = budget.reserve(60)
    with pytest.raises(ServiceError) as grown:
        r.grow(41)
    assert grown.value.status == 413
    assert budget.in_use == 60


def test_grow_and_shared_holders():
    budget = MemoryBudget(100)
    r = budget.reserve(10)
    r.grow(20)
    assert budget.in_use == 30
    r.retain()  # a job on the worker
    r.release()  # the request is answered
    assert budget.in_use == 30  # the job still computes
    r.release()
    assert budget.in_use == 0 and r.released
    with pytest.raises(RuntimeError):
        r.retain()
    r.grow(5)  # after the last release: given straight back
    assert budget.in_use == 0


def test_concurrent_reservations_never_pass_the_limit():
    budget = MemoryBudget(1000)
    held = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            r = budget.try_reserve(7)
            if r is not None:
                with lock:
                    held.append(r)
                assert budget.in_use <= 1000

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.in_use == 7 * len(held) <= 1000 and budget.peak <= 1000
    for r in held:
        r.release()
    assert budget.in_use == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        MemoryBudget(0)
    with pytest.raises(ValueError, match="negative"):
        MemoryBudget(10).try_reserve(-1)
