"""Prometheus metrics, in a registry of the app's own (tests build many apps)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from service.budget import MemoryBudget
    from service.device import Device
    from service.protocol import ConnectionGate

__all__ = ["Histogram", "Metrics"]


class Histogram(prometheus_client.Histogram):
    """prometheus_client's histogram, finding an observation's bucket by bisection, and taking many at once.

    The stock ``observe`` walks the bucket bounds in Python (a millisecond request latency passes
    six of them) and takes a lock per observation; the device worker observes the queue wait of
    every request of a merged call, the event loop the latency of every request. The same buckets
    and counts as the stock class; ``observe_many``'s sum is added once, so its last bits may
    differ from one addition per amount (``tests/service/test_metrics.py`` compares them).
    """

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar:
            super().observe(amount, exemplar)
            return
        self._raise_if_not_observable()
        self._sum.inc(amount)
        # The first bucket whose bound is >= amount (the bounds end with +Inf); NaN counts in none.
        if amount == amount:
            self._buckets[bisect_left(self._upper_bounds, amount)].inc(1)

    def observe_many(self, amounts: Iterable[float]) -> None:
        """``observe`` each of ``amounts``: one update of each bucket touched, not one per amount."""
        self._raise_if_not_observable()
        if not isinstance(amounts, list):
            amounts = list(amounts)
        if not amounts:
            return
        self._sum.inc(sum(amounts))
        bounds, buckets = self._upper_bounds, self._buckets
        for index, count in Tally(bisect_left(bounds, a) for a in amounts if a == a).items():
            buckets[index].inc(count)


# Seconds: from a 8x8 solve (~100 us) to a 8192^2 factorization (seconds).
_LATENCY = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, device_kind: str, device_name: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.device = device_kind
        self.requests = Counter(
            "lu_requests", "Requests answered (HTTP and gRPC).", ["endpoint", "method", "status", "device"], registry=r
        )
        self.latency = Histogram(
            "lu_request_duration_seconds", "Time from request to response.", ["endpoint", "device"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "lu_queue_wait_seconds", "Time a job waited for the device worker.", buckets=_LATENCY, registry=r
        )
        self.compute_seconds = Histogram(
            "lu_compute_seconds", "Time the device worker spent on a job (copies included).", ["operation", "device"],
            buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.batch_size = Histogram(
            "lu_batch_size", "Requests computed by one call on the device (dynamic batching).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r,
        )  # fmt: skip
        self.batch_wait = Histogram(
            "lu_batch_wait_seconds", "Time the worker spent gathering a batch (LU_BATCH_DELAY_US).",
            buckets=(0.00001, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05), registry=r,
        )  # fmt: skip
        # Counters, not histograms: their rate is the worker's utilisation, and over requests answered
        # (lu_batch_size_sum) its time per request, the number dynamic batching is meant to cut.
        self.worker_busy = Counter(
            "lu_worker_busy_seconds", "Wall time the device worker spent on jobs (not waiting for the queue).",
            registry=r,
        )  # fmt: skip
        self.worker_cpu = Counter(
            "lu_worker_cpu_seconds", "CPU time of the device worker's thread spent on jobs (GIL waits excluded).",
            registry=r,
        )  # fmt: skip
        self.device_seconds = Histogram(
            "lu_device_seconds",
            "Device time of a job by stage (upload, compute, download: CUDA events on a GPU; host: a small "
            "job a GPU service computed on the host; compute on the CPU).",
            ["operation", "stage", "device"], buckets=_LATENCY, registry=r,
        )  # fmt: skip
        self.bytes_in = Counter("lu_request_bytes", "Request body bytes received.", ["endpoint"], registry=r)
        self.bytes_out = Counter("lu_response_bytes", "Response body bytes sent.", ["endpoint"], registry=r)
        self.bytes_direct = Counter(
            "lu_request_bytes_direct", "Request body bytes read from the socket straight into the request's buffer.",
            registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge("lu_queue_depth", "Jobs waiting for the device worker.", registry=r)
        self.in_flight = Gauge("lu_requests_in_flight", "Requests being served.", registry=r)
        self.rejected = Counter("lu_rejected", "Jobs refused with a 503.", ["reason"], registry=r)
        self.deadline_exceeded = Counter(
            "lu_deadline_exceeded", "Jobs dropped because their deadline passed while they waited.", registry=r
        )
        self.errors = Counter("lu_errors", "Error responses by stable code.", ["code"], registry=r)
        info = Gauge(
            "lu_device_info", "The device this process computes on (always 1).", ["device", "name"], registry=r
        )
        info.labels(device_kind, device_name).set(1)
        # observe_request's labelled children by (endpoint, method, status): a bounded set (route
        # templates, the methods the HTTP parser accepts, status codes), like the series themselves.
        self._request_children: dict[tuple[str, str, str], tuple[Any, Any, Any, Any]] = {}

    def protocol_refusal(self, status: int, code: str) -> None:
        """A request refused by the HTTP protocol layer (timeout, header size, unparsable) before the app saw it."""
        self.requests.labels("unmatched", "-", str(status), self.device).inc()
        self.errors.labels(code).inc()

    def watch_connections(self, gate: ConnectionGate) -> None:
        """Gauges read from the HTTP server's connection count at scrape time."""
        r = self.registry
        Gauge("lu_http_connections", "HTTP connections open now.", registry=r).set_function(lambda: gate.open)
        Gauge("lu_http_connections_limit", "LU_MAX_CONNECTIONS.", registry=r).set(gate.limit)

    def watch_budget(self, budget: MemoryBudget) -> None:
        """Gauges read from the in-flight budget at scrape time."""
        r = self.registry
        Gauge("lu_inflight_bytes", "Bytes reserved for requests now.", registry=r).set_function(lambda: budget.in_use)
        Gauge("lu_inflight_limit_bytes", "LU_MAX_INFLIGHT_BYTES.", registry=r).set(budget.limit)
        Gauge("lu_inflight_peak_bytes", "Most bytes reserved at once since start.", registry=r).set_function(
            lambda: budget.peak
        )

    def watch_body_pool(self, pool: Any) -> None:
        """Gauges read from the receive-buffer pool (:class:`service.bodies.BodyPool`) at scrape time."""
        r = self.registry
        Gauge(
            "lu_body_pool_idle_bytes", "Idle receive buffers kept for reuse (LU_BODY_POOL_BYTES).", registry=r
        ).set_function(lambda: pool.idle_bytes)
        Gauge(
            "lu_body_pool_held_bytes",
            "Bytes the receive-buffer pool holds reserved in lu_inflight_bytes (idle buffers, slack of lent ones).",
            registry=r,
        ).set_function(lambda: pool.held_bytes)
        Gauge(
            "lu_body_pool_reuses", "Request bodies received into a reused buffer since start.", registry=r
        ).set_function(lambda: pool.stats.hits)
        if pool.pinner is not None:  # a GPU: idle buffers page-locked for direct uploads (service.pinning)
            Gauge(
                "lu_body_pool_pinned_bytes",
                "Receive buffers page-locked for direct uploads (counted in lu_pinned_memory_in_use_bytes).",
                registry=r,
            ).set_function(lambda: pool.pinner.pinned_bytes)

    def watch_store(self, store: Any) -> None:
        """Export a :class:`service.store.FactorizationStore`'s counters, read at each scrape."""
        self.registry.register(_StoreCollector(store))

    def observe_request(
        self, endpoint: str, method: str, status: str, seconds: float, bytes_in: int, bytes_out: int
    ) -> None:
        """Count one answered request (HTTP: method and status code; gRPC: ``gRPC`` and the status name)."""
        key = (endpoint, method, status)
        children = self._request_children.get(key)
        if children is None:  # label lookups cost more than the updates: done once per label set
            children = (
                self.requests.labels(endpoint, method, status, self.device),
                self.latency.labels(endpoint, self.device),
                self.bytes_in.labels(endpoint),
                self.bytes_out.labels(endpoint),
            )
            self._request_children[key] = children
        requests, latency, received, sent = children
        requests.inc()
        latency.observe(seconds)
        received.inc(bytes_in)
        sent.inc(bytes_out)

    def watch_device_memory(self, device: Device) -> None:
        """Gauges read from the device at each scrape: memory in use and its limits."""
        r = self.registry
        Gauge("lu_device_memory_in_use_bytes", "Device memory held by the pool for requests.", registry=r).set_function(
            device.memory_in_use
        )
        Gauge("lu_pinned_memory_in_use_bytes", "Pinned host memory held for staging.", registry=r).set_function(
            device.pinned_in_use
        )
        # +Inf where there is no limit (the CPU).
        Gauge("lu_device_memory_limit_bytes", "Limit of the device memory pool.", registry=r).set_function(
            lambda: math.inf if device.memory_limit is None else device.memory_limit
        )
        Gauge("lu_pinned_memory_limit_bytes", "Limit of pinned staging memory.", registry=r).set_function(
            lambda: math.inf if device.pinned_limit is None else device.pinned_limit
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        self.store.expire()  # a scrape sees (and frees) what has expired since the last request
        s = self.store.stats
        yield GaugeMetricFamily(
            "lu_store_bytes", "Bytes of stored factorizations, 2 KiB of bookkeeping each included.", value=s.bytes
        )
        yield GaugeMetricFamily("lu_store_limit_bytes", "LU_STORE_BYTES.", value=self.store.limit_bytes)
        yield GaugeMetricFamily("lu_store_entries", "Stored factorizations.", value=s.entries)
        yield CounterMetricFamily("lu_store_hits", "Lookups that found their factorization.", value=s.hits)
        yield CounterMetricFamily("lu_store_misses", "Lookups answered 404 unknown_factorization.", value=s.misses)
        yield CounterMetricFamily(
            "lu_store_evictions", "Factorizations evicted (least recently used).", value=s.evictions
        )
        yield CounterMetricFamily(
            "lu_store_expiries", "Factorizations expired after LU_STORE_TTL_S idle.", value=s.expiries
        )
