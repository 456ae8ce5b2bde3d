"""Dynamic batching: queued jobs of one operation, dtype, matrix shape and options become one call.

Every job the device runs pays a fixed cost whatever its size (on the CPU a
kernel launch and thread wake-up, on a GPU a launch, a synchronisation and two
copies), so many clients sending one small system each should cost the device
one batched call. The worker hands each job it takes to :func:`gather`, which
takes the jobs already queued (or arriving within ``LU_BATCH_DELAY_US``) that
:func:`merge_key` says are compatible; :func:`launch_merged` stacks their tensors
along one batch axis, computes once and splits the answers back.

Two jobs are compatible when they ask for the same operation with the same
options, and their tensors have the same names, dtypes and per-matrix shapes;
batch shapes may differ (each job's batch is flattened, stacked, and restored
on the way out). A job whose tensors broadcast against each other (an LU batch
and a B batch of different shapes) runs alone.

Answers are bit-identical to the job served alone: on the CPU ``lu_core``
computes every matrix of a batch independently, by an algorithm chosen from the
matrix's shape and dtype, never from the batch size, or else by two that give the
same bits (small real matrices eight at a time in SIMD lanes, or one by one;
``tests/lu_core/test_lanes.py``) (``tests/service/test_batching.py``
checks it for every operation and dtype, and ``tests/lu_core`` for the kernels);
on a GPU only the jobs whose routine does not depend on the batch are merged
(``service.device.gpu_merges``). When
the merged call fails (a singular system with ``check_errors``, out of memory),
each job is run alone, so every failure stays with its own request and indices.
"""

from __future__ import annotations

import math
import queue
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["MERGEABLE", "BatchJob", "gather", "launch_merged", "merge_key", "signature"]

# Core (per-matrix) rank of each input: the dimensions after the batch dimensions.
_CORE_RANK = {"A": 2, "LU": 2, "pivots": 1}
# Operations whose every matrix is computed independently of the others in the batch, so that a merged
# call answers bit for bit what each request alone would. solve_refined and lu_rcond iterate until every
# matrix of the call has converged, so a matrix's result can depend on its neighbours: they run alone.
MERGEABLE = frozenset({"lu_factor", "lu_unpack", "lu_solve", "lu", "solve", "det", "slogdet"})
_PRIMARY = ("A", "LU")


class Started(Protocol):
    def compute(self) -> None: ...

    def result(self) -> dict[str, Any]: ...


#: ``Device.launch_stacked``: a call over stacked parts, started; its answer from ``.result()``.
LaunchStacked = Callable[..., Started]


class BatchJob(Protocol):
    name: str
    compute: Callable[[Mapping[str, Any], Mapping[str, bool]], dict[str, Any]]
    tensors: Mapping[str, np.ndarray]
    options: Mapping[str, bool]
    signature: Hashable  # signature(name, compute, tensors, options), built where the job is made


def signature(
    name: str, compute: Callable[..., Any], tensors: Mapping[str, np.ndarray], options: Mapping[str, bool]
) -> Hashable:
    """What makes two jobs alike: operation, options, and each tensor's name, shape and dtype.

    Jobs with equal signatures have equal :func:`merge_key` and sizes. Built by the submitter (the
    event loop), so that the worker, which gathers a batch, compares one value per job instead of
    building each job's key (the worker's cost per merged job is what batching is meant to cut).
    """
    return name, compute, tuple(options.items()), tuple([(k, t.shape, t.dtype) for k, t in tensors.items()])


def _batch_shape(op: str, tensors: Mapping[str, np.ndarray]) -> tuple[int, ...] | None:
    """The job's batch shape, if every tensor has exactly it as leading dimensions (no broadcasting)."""
    primary = next((tensors[n] for n in _PRIMARY if n in tensors), None)
    if primary is None or primary.ndim < 2:
        return None
    batch = primary.shape[:-2]
    for name, t in tensors.items():
        core = _CORE_RANK.get(name)
        if core is None:
            # A right-hand side: a matrix per system; for solve also a vector per system, which
            # stays a vector once stacked (torch's rule: B.shape == A.shape[:-1]).
            if not (t.ndim - len(batch) == 2 or (op == "solve" and t.ndim - len(batch) == 1)):
                return None
        elif t.ndim - len(batch) != core:
            return None
        if t.shape[: len(batch)] != batch:
            return None
    return batch


def merge_key(job: BatchJob) -> Hashable | None:
    """Jobs with equal keys can share one call; ``None`` for a job that must run alone (among them every
    job its submitter gave no signature: see ``service.worker.DeviceWorker.submit``)."""
    if job.name not in MERGEABLE or job.signature is None:
        return None
    batch = _batch_shape(job.name, job.tensors)
    if batch is None:
        return None
    n = len(batch)
    tensors = tuple(sorted((name, t.dtype.str, t.shape[n:]) for name, t in job.tensors.items()))
    return job.name, job.compute, tuple(sorted(job.options.items())), tensors


def _elements(job: BatchJob) -> int:
    return sum(t.size for t in job.tensors.values())


def gather(
    first: Any,
    take: Callable[[float | None], Any],
    pending: deque[Any],
    *,
    max_batch: int,
    max_elements: int,
    delay_s: float,
    is_job: Callable[[Any], bool],
    is_barrier: Callable[[Any], bool],
) -> list[Any]:
    """``first`` and the compatible jobs after it, in arrival order.

    ``pending`` holds items taken out of the queue earlier and not yet run (they keep their
    order and are looked at first); ``take(timeout)`` takes what is queued next, a non-empty
    list of items (all that arrived together), waiting at most ``timeout`` seconds (``None``:
    do not wait), or raises ``queue.Empty``. Items that do not join the batch are appended to
    ``pending``, to be run next, in order. ``is_job`` says whether an item may join (a live
    job); ``is_barrier`` marks items nothing after them may run ahead of (a call, the stop):
    gathering ends there. Other items (a cancelled job) are passed over and stay in order.
    Items are looked at in a plain loop, a whole list at a time: this runs once per merged
    job, the cost batching is meant to cut.

    Nothing taken is lost if this raises (a bug): ``pending`` then holds every item but ``first``
    that was in it or was taken, in arrival order, and the caller runs ``first`` alone.
    """
    if max_batch <= 1:
        return [first]
    earlier = list(pending)  # older than anything taken below; pending holds them again if this fails
    taken: list[Any] = []  # what this call takes from the queue, in arrival order

    def taking(timeout: float | None) -> list[Any]:
        items = take(timeout)
        taken.extend(items)
        return items

    try:
        ahead: list[Any] = []
        if not pending and delay_s <= 0:
            # A lone job (nothing else queued, no delay to wait) runs as it is, without building its key.
            try:
                ahead = taking(None)
            except queue.Empty:
                return [first]
        key = merge_key(first)
        if key is None:
            pending.extend(ahead)
            return [first]
        first_size = _elements(first)
        batch, elements = [first], first_size
        like_first = first.signature

        def scan(items: Sequence[Any]) -> bool:
            """Join what can of ``items``, in order, the others to ``pending``; False: look no further."""
            nonlocal elements
            for i, item in enumerate(items):
                if len(batch) >= max_batch or is_barrier(item):
                    pending.extend(items[i:])  # full, or a call or the stop: nothing after it runs first
                    return False
                if not is_job(item):
                    pending.append(item)
                    continue
                # Most often a job is just like the first (clients sending the same kind of request): then
                # its key and size are the first's, known without building them (the worker interns
                # signatures: alike is identical, found without reading the tuples).
                if like_first is not None and (item.signature is like_first or item.signature == like_first):
                    size = first_size
                elif merge_key(item) == key:
                    size = _elements(item)
                else:
                    pending.append(item)
                    continue
                if elements + size > max_elements:
                    pending.append(item)
                    continue
                batch.append(item)
                elements += size
            return True

        pending.clear()
        if not scan(earlier) or (ahead and not scan(ahead)):  # pending was empty if ahead: it is the oldest left
            return batch
        deadline = time.perf_counter() + delay_s
        while len(batch) < max_batch:
            remaining = deadline - time.perf_counter()
            try:
                items = taking(remaining if remaining > 0 else None)
            except queue.Empty:
                break
            if not scan(items):
                break
        return batch
    except BaseException:
        pending.clear()
        pending.extend(earlier)
        pending.extend(taken)
        raise


Split = Callable[[dict[str, Any]], list[dict[str, Any]]]


def launch_merged(launch_stacked: LaunchStacked, jobs: Sequence[BatchJob]) -> tuple[Started, Split]:
    """Start ``jobs`` (compatible, at least one) as one call: the started call (``compute()`` it, then
    ``result()``) and the function that splits its outputs into each job's answer, shaped as if alone.

    ``launch_stacked`` (:meth:`service.device.Device.launch_stacked`) gets each input as the list of the
    jobs' parts, flattened to one batch axis, and concatenates them where the device reads them.
    """
    first = jobs[0]
    primary = next(p for p in _PRIMARY if p in first.tensors)
    batches = [job.tensors[primary].shape[:-2] for job in jobs]
    if not any(batches):
        return _launch_single(launch_stacked, jobs)
    n = len(batches[0])
    counts = [math.prod(b) for b in batches]
    parts = {
        # A method call, not np.reshape: this runs once per job and input.
        name: [job.tensors[name].reshape((c, *t.shape[n:])) for job, c in zip(jobs, counts, strict=True)]
        for name, t in first.tensors.items()
    }

    def answers(outputs: dict[str, Any]) -> list[dict[str, Any]]:
        items = outputs.items()
        split: list[dict[str, Any]] = []
        start = 0
        for batch, count in zip(batches, counts, strict=True):
            if not batch:  # one matrix: index the output (a view without the batch axis, 0-d an array too)
                split.append({k: None if v is None else v[start, ...] for k, v in items})
            else:
                stop = start + count
                shaped = {k: None if v is None else v[start:stop].reshape((*batch, *v.shape[1:])) for k, v in items}
                split.append(shaped)
            start += count
        return split

    return launch_stacked(first.compute, parts, first.options), answers


def _launch_single(launch_stacked: LaunchStacked, jobs: Sequence[BatchJob]) -> tuple[Started, Split]:
    """:func:`launch_merged` when every job is one matrix (the common case of many small requests).

    The same call and answers, cheaper per job (measured: half the cost): the jobs' matrices are
    stacked along a new axis by the device (``new_axis``: on the CPU one ``np.asarray``, no
    view per job), and the answers taken by iterating over each output's first axis.
    """
    first = jobs[0]
    parts = {name: [job.tensors[name] for job in jobs] for name in first.tensors}
    count = len(jobs)

    def answers(outputs: dict[str, Any]) -> list[dict[str, Any]]:
        columns = [
            # Iterating yields v[i] for each i (views); a 1-D output's v[i] would be a NumPy scalar, v[i, ...] is 0-d.
            [None] * count if v is None else list(v) if v.ndim > 1 else [v[i, ...] for i in range(count)]
            for v in outputs.values()
        ]
        if len(columns) == 1:  # one output (solve, lu_solve, det): no zip per job
            (key,), (column,) = outputs, columns
            return [{key: x} for x in column]
        return [dict(zip(outputs, row, strict=True)) for row in zip(*columns, strict=True)]

    return launch_stacked(first.compute, parts, first.options, new_axis=True), answers
