"""service.metrics.Histogram: the stock histogram's exposition, with bisection and many observations at once."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from service.metrics import Histogram

BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 1, 60)
# Every bound, just below and just above it, zero, negatives, +-inf and NaN.
EDGES = [b + d for b in BOUNDS for d in (-1e-12, 0.0, 1e-12)] + [0.0, -1.0, math.inf, -math.inf, math.nan]


def _pair(labels: tuple[str, ...] = ()) -> tuple[prometheus_client.Histogram, Histogram, CollectorRegistry, ...]:
    stock_registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    stock = prometheus_client.Histogram("h", "doc", labels, buckets=BOUNDS, registry=stock_registry)
    ours = Histogram("h", "doc", labels, buckets=BOUNDS, registry=ours_registry)
    return stock, ours, stock_registry, ours_registry


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _same(stock: CollectorRegistry, ours: CollectorRegistry, exact_sum: bool = True) -> None:
    a, b = _samples(stock), _samples(ours)
    assert a.keys() == b.keys()
    for key, value in a.items():
        if key[0].endswith("_sum") and not exact_sum:
            assert b[key] == pytest.approx(value, rel=1e-12, abs=1e-300, nan_ok=True)
        else:
            assert b[key] == value or (math.isnan(value) and math.isnan(b[key])), key


def test_observe_counts_each_edge_in_the_stock_bucket() -> None:
    for amount in EDGES:
        stock, ours, rs, ro = _pair()
        stock.observe(amount)
        ours.observe(amount)
        _same(rs, ro)


# Durations (what the service observes): non-negative and finite, so that one sum and a sum per
# amount differ only in rounding (Python 3.12's sum() compensates; +-1e100 would make it exact).
DURATIONS = st.one_of(st.sampled_from([e for e in EDGES if e >= 0 and math.isfinite(e)]), st.floats(0, 1e4))


@given(st.lists(DURATIONS, max_size=50))
def test_observe_many_is_observe_of_each(amounts: list[float]) -> None:
    stock, ours, rs, ro = _pair()
    for amount in amounts:
        stock.observe(amount)
    ours.observe_many(amounts)
    _same(rs, ro, exact_sum=False)


def test_observe_many_counts_nan_and_infinities_as_observe_does() -> None:
    stock, ours, rs, ro = _pair()
    amounts = [math.nan, math.inf, 0.002, -1.0]
    for amount in amounts:
        stock.observe(amount)
    ours.observe_many(amounts)
    _same(rs, ro)


def test_labelled_children_and_exemplars() -> None:
    stock, ours, rs, ro = _pair(("op",))
    for h in (stock, ours):
        h.labels("solve").observe(0.002)
        h.labels("solve").observe(0.003, {"trace_id": "abc"})
    ours.labels("det").observe_many([0.2, 2.0])
    stock.labels("det").observe(0.2)
    stock.labels("det").observe(2.0)
    _same(rs, ro)
    with pytest.raises(ValueError, match="missing label values"):
        ours.observe_many([1.0])
    with pytest.raises(ValueError, match="missing label values"):
        ours.observe(1.0)
