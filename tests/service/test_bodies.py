"""The receive-buffer pool (service/bodies.py): lifetime, size classes, exact lengths, memory accounting.

In-process tests drive the pool and the app's real request path; the last ones use the real server
(`python -m service`, whose protocol writes bodies straight into the pooled buffer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading

import anyio.to_thread
import httpx
import numpy as np
import pytest

from service.bodies import MIN_POOLED, BodyPool, size_class
from service.budget import MemoryBudget
from service.errors import ServiceError
from tests.service.test_e2e import Server, serving
from tests.service.wire import binary_request, parse_binary

MiB = 1 << 20


# --------------------------------------------------------------------------- the pool alone


def test_size_classes_are_a_quarter_octave_apart_and_never_smaller_than_the_body():
    assert size_class(1) == MIN_POOLED
    for n in [MIN_POOLED, MIN_POOLED + 1, 100_000, 128 * MiB, 128 * MiB + 1, 200 * MiB, 256 * MiB]:
        c = size_class(n)
        assert n <= c < 1.25 * n + 1, (n, c)
    assert size_class(128 * MiB) == 128 * MiB
    assert {size_class(n) for n in range(96 * MiB + 1, 112 * MiB + 1, MiB)} == {112 * MiB}
    # a small body never shares a class with a big one
    assert size_class(MiB) < size_class(2 * MiB) < size_class(256 * MiB)


def test_a_buffer_returns_only_when_the_last_holder_lets_go_and_is_reused_after():
    pool = BodyPool(64 * MiB)
    first = pool.take(MiB)
    first.retain()  # e.g. the job on the worker
    np.frombuffer(first.view, np.uint8)[:] = 7
    first.release()  # the request ended, the job still runs
    assert pool.idle_bytes == 0
    second = pool.take(MiB)
    assert second.capacity == first.capacity and not np.shares_memory(
        np.frombuffer(first.view, np.uint8), np.frombuffer(second.view, np.uint8)
    )
    first.release()  # the job ended
    assert pool.idle_bytes == first.capacity
    third = pool.take(MiB - 100)  # same class: reused
    assert pool.stats.hits == 1
    assert np.shares_memory(np.frombuffer(first.view, np.uint8), np.frombuffer(third.view, np.uint8))
    first.release()  # idempotent past zero: no second return
    assert pool.idle_bytes == 0
    with pytest.raises(RuntimeError):
        first.retain()
    second.release()
    third.release()


def test_views_are_exactly_the_body_length():
    pool = BodyPool(64 * MiB)
    big = pool.take(MiB)
    np.frombuffer(big.view, np.uint8)[:] = 0xAB
    big.release()
    small = pool.take(MiB - 12345)
    assert pool.stats.hits == 1
    assert len(small.view) == MiB - 12345 and small.view.nbytes == MiB - 12345
    assert len(np.frombuffer(small.view, np.uint8)) == MiB - 12345


def test_small_bodies_are_not_pooled_and_a_small_request_never_takes_a_big_buffer():
    pool = BodyPool(512 * MiB)
    tiny = pool.take(100)
    assert not tiny.pooled and len(tiny.view) == 100
    big = pool.take(64 * MiB)
    big.release()
    assert pool.idle_bytes == 64 * MiB
    small = pool.take(MiB)
    assert small.capacity == MiB and pool.stats.hits == 0 and pool.idle_bytes == 64 * MiB


def test_idle_bytes_are_bounded_oldest_evicted_and_zero_pools_nothing():
    pool = BodyPool(3 * MiB)
    leases = [pool.take(MiB) for _ in range(4)]
    for lease in leases:
        lease.release()
    assert pool.idle_bytes == 3 * MiB and pool.stats.dropped == 1
    assert pool.take(8 * MiB).pooled is False  # bigger than the whole pool: never kept
    off = BodyPool(0)
    lease = off.take(8 * MiB)
    assert not lease.pooled
    lease.release()
    assert off.idle_bytes == 0


def test_idle_and_slack_bytes_are_reserved_and_reclaimed_when_a_request_needs_the_room():
    budget = MemoryBudget(10 * MiB)
    pool = BodyPool(8 * MiB, budget)
    request = budget.reserve(3 * MiB)  # what the middleware reserves for a body (and more)
    size = 2 * MiB + 1  # class 2.5 MiB: the slack is the pool's
    lease = pool.take(size)
    assert budget.in_use == 3 * MiB + (size_class(size) - size) == 3 * MiB + pool.held_bytes
    request.on_release(lease.release)
    request.release()
    assert pool.idle_bytes == size_class(size) and budget.in_use == pool.held_bytes == size_class(size)
    # a reservation that fits only without the idle buffer: the pool gives it up, no 503
    other = budget.reserve(9 * MiB + MiB // 2)
    assert pool.idle_bytes == 0 and pool.held_bytes == 0 and pool.stats.reclaimed_bytes == size_class(size)
    # with no room left in the budget, a returned buffer is freed rather than kept
    lease2 = pool.take(MiB)
    assert budget.in_use == 9 * MiB + MiB // 2  # class == size: no slack
    lease2.release()
    assert pool.idle_bytes == 0 and budget.in_use == 9 * MiB + MiB // 2 and pool.stats.dropped == 1
    other.release()
    assert budget.in_use == 0
    with pytest.raises(ServiceError):  # still refused when even an empty pool cannot make room
        budget.reserve(10 * MiB + 1)


def test_on_release_runs_once_after_the_last_holder_even_when_added_late():
    budget = MemoryBudget(MiB)
    r = budget.reserve(100)
    r.retain()
    calls: list[int] = []
    r.on_release(lambda: calls.append(budget.in_use))
    r.release()
    assert calls == []
    r.release()
    assert calls == [0]  # the bytes are back before the callback runs
    r.on_release(lambda: calls.append(-1))  # already released: at once
    r.release()
    assert calls == [0, -1]


def test_concurrent_take_and_release_from_threads_keep_the_books():
    budget = MemoryBudget(256 * MiB)
    pool = BodyPool(16 * MiB, budget)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                size = int(rng.integers(MIN_POOLED, 3 * MiB))
                lease = pool.take(size)
                view = np.frombuffer(lease.view, np.uint8)
                view[:] = seed
                assert (view == seed).all()  # nobody else wrote into it meanwhile
                lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert pool.idle_bytes <= 16 * MiB and budget.in_use == pool.held_bytes == pool.idle_bytes
    pool.clear()
    assert budget.in_use == 0


def test_rejects_negative_sizes_and_limits():
    with pytest.raises(ValueError, match="idle_limit"):
        BodyPool(-1)
    with pytest.raises(ValueError, match="size"):
        BodyPool(MiB).take(-1)


# --------------------------------------------------------------------------- the app's request path


def _system(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"A": rng.standard_normal((n, n)) + n * np.eye(n), "B": rng.standard_normal((n, 1))}


def _solution(content: bytes, headers: httpx.Headers) -> np.ndarray:
    _, out = parse_binary(content, int(headers["inference-header-content-length"]))
    return out["X"]


@pytest.mark.anyio
async def test_a_buffer_is_not_reused_while_the_job_of_a_departed_client_still_reads_it(make_client, monkeypatch):
    """Client 1 leaves while its job computes; client 2's body must not land in client 1's buffer."""
    client = await make_client(max_batch=1)
    app = client.app  # type: ignore[attr-defined]
    pool: BodyPool = app.state.bodies
    device = app.state.worker.device
    n = 128  # 128 KiB of A: pooled
    first, second = _system(n, 1), _system(n, 2)
    started, go = threading.Event(), threading.Event()
    seen: dict[str, np.ndarray] = {}
    real_run = device.run

    def run(compute, tensors, options):
        if "A" in tensors and not seen and not started.is_set():
            started.set()
            go.wait(60)  # the job keeps computing after its client left
            seen["A"] = np.array(tensors["A"])  # what the job reads once client 2's body has arrived
        return real_run(compute, tensors, options)

    monkeypatch.setattr(device, "run", run)
    body1, headers1 = binary_request(first)
    task1 = asyncio.create_task(client.post("/solve", content=body1, headers=headers1))
    await anyio.to_thread.run_sync(started.wait, 60)
    task1.cancel()  # the client leaves: the request ends, its job does not
    with pytest.raises(asyncio.CancelledError):
        await task1
    assert pool.idle_bytes == 0  # the job still holds the buffer
    body2, headers2 = binary_request(second)
    task2 = asyncio.create_task(client.post("/solve", content=body2, headers=headers2))
    while pool.stats.hits + pool.stats.misses < 2:  # client 2's body has its buffer
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert pool.stats.hits == 0 and pool.stats.misses == 2
    go.set()
    r2 = await task2
    assert r2.status_code == 200
    np.testing.assert_array_equal(seen["A"], first["A"])  # client 1's job read client 1's matrix
    np.testing.assert_allclose(_solution(r2.content, r2.headers), np.linalg.solve(second["A"], second["B"]))
    # once both jobs and requests have ended, the buffers are reused
    body3, headers3 = binary_request(_system(n, 3))
    r3 = await client.post("/solve", content=body3, headers=headers3)
    assert r3.status_code == 200 and pool.stats.hits == 1
    for _ in range(500):  # the worker lets go of the job's hold just after it answers
        if app.state.budget.in_use == pool.held_bytes:
            break
        await asyncio.sleep(0.01)
    assert app.state.budget.in_use == pool.held_bytes


@pytest.mark.anyio
async def test_a_shorter_body_in_a_reused_buffer_decodes_exactly(make_client):
    client = await make_client()
    pool: BodyPool = client.app.state.bodies  # type: ignore[attr-defined]
    for n, seed in [(150, 1), (146, 2), (155, 3), (148, 4)]:  # all in one size class: 160..192 KiB
        system = _system(n, seed)
        body, headers = binary_request(system)
        r = await client.post("/solve", content=body, headers=headers)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(_solution(r.content, r.headers), np.linalg.solve(system["A"], system["B"]))
    assert pool.stats.hits >= 3
    # a body with bytes left over past the last tensor is still refused (the tail is not the buffer's)
    body, headers = binary_request(_system(140, 5))
    r = await client.post("/solve", content=body + b"\0" * 8, headers=headers)
    assert r.status_code == 400 and r.json()["code"] == "malformed_body"


# --------------------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def server():
    yield from serving(LU_WARMUP="false", LU_READ_TIMEOUT_S="5", LU_MIN_UPLOAD_RATE="0")


def _metric(server: Server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


def _raw_post(server: Server, path: str, head_extra: dict[str, str], payload: bytes, declared: int) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {declared}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in head_extra.items()) + "\r\n"
        sock.sendall(head.encode() + payload)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while data := sock.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_real_server_bodies_of_one_class_in_turn_each_decode_to_their_own_bytes(server):
    """Through the protocol's body sink: reused buffers, exact lengths, a truncated body is refused."""
    before = _metric(server, "lu_body_pool_reuses")
    for n, seed in [(200, 1), (185, 2), (200, 3), (190, 4)]:  # one size class: 256..320 KiB
        system = _system(n, seed)
        body, headers = binary_request(system)
        r = httpx.post(f"{server.url}/solve", content=body, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(_solution(r.content, r.headers), np.linalg.solve(system["A"], system["B"]))
    assert _metric(server, "lu_body_pool_reuses") >= before + 3
    # a body that stops short of its Content-Length, in a buffer that held a longer body: 400, never stale bytes
    body, headers = binary_request(_system(190, 5))
    raw = _raw_post(server, "/solve", headers, body[:-1000], len(body))
    status = int(raw.split()[1]) if raw else None
    assert status in (400, None), raw[:200]  # None: the server closed without an answer (client gone)
    assert b"truncated_body" in raw or not raw
    # and the next request of the class is served from the pool, correctly
    system = _system(185, 6)
    body, headers = binary_request(system)
    r = httpx.post(f"{server.url}/solve", content=body, headers=headers, timeout=120)
    assert r.status_code == 200
    np.testing.assert_allclose(_solution(r.content, r.headers), np.linalg.solve(system["A"], system["B"]))
    assert _metric(server, "lu_inflight_bytes") == _metric(server, "lu_body_pool_held_bytes")


def test_real_server_a_body_that_stalls_is_a_408_and_its_buffer_is_not_written_after(server):
    body, headers = binary_request(_system(200, 7))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"POST /solve HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode() + body[: len(body) // 2])
        sock.settimeout(30)
        answer = sock.recv(65536)
        assert int(answer.split()[1]) == 408
        with contextlib.suppress(OSError):  # the rest comes after the 408: nothing lands in the pooled buffer
            sock.sendall(body[len(body) // 2 :])
    system = _system(199, 8)
    body, headers = binary_request(system)
    r = httpx.post(f"{server.url}/solve", content=body, headers=headers, timeout=120)
    assert r.status_code == 200
    np.testing.assert_allclose(_solution(r.content, r.headers), np.linalg.solve(system["A"], system["B"]))


def test_real_server_answers_expect_100_continue_before_the_body(server):
    """A client that sends ``Expect: 100-continue`` waits for it before sending the body (the sink sends it)."""
    system = _system(190, 9)
    body, headers = binary_request(system)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"POST /solve HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)  # no half-close: the server would take it for a client that left
        raw = b""
        while b"\r\n\r\n" not in raw:
            raw += sock.recv(65536)
        head, _, content = raw.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(content) < length:
            content += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
    hlen = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"inference-header")
    )
    _, out = parse_binary(content, hlen)
    np.testing.assert_allclose(out["X"], np.linalg.solve(system["A"], system["B"]))


@pytest.mark.parametrize("value", ["-1", "lots", "1e400", "2.5"])
def test_the_pool_setting_refuses_bad_values(monkeypatch, value):
    """LU_BODY_POOL_BYTES is a byte count >= 0 (0 turns the pool off); anything else stops the start."""
    from pydantic import ValidationError

    from service.config import Settings

    monkeypatch.setenv("LU_BODY_POOL_BYTES", value)
    with pytest.raises(ValidationError, match="body_pool_bytes"):
        Settings()
    monkeypatch.setenv("LU_BODY_POOL_BYTES", "0")
    assert Settings().body_pool_bytes == 0


@pytest.mark.anyio
async def test_no_answer_or_stored_factorization_aliases_a_pooled_body(make_client, monkeypatch):
    """Decoded tensors are views into a pooled buffer that the next request may overwrite: every output
    (which may outlive the request: a stored factorization) must be memory of its own."""
    import service.pipeline as pipeline

    client = await make_client()
    leased: list[np.ndarray] = []
    outputs: dict[str, list[tuple[str, np.ndarray]]] = {}  # the request's case -> its (output name, array)
    case = ""
    take = BodyPool.take

    def recording_take(self, size):
        lease = take(self, size)
        leased.append(np.frombuffer(lease.view, np.uint8))
        return lease

    encode = pipeline._encode

    async def recording_encode(out, fn, *args):
        # (slogdet and det answer NumPy scalars: memory of their own, but every case must show its outputs)
        outputs.setdefault(case, []).extend((k, v) for k, v in out.items() if isinstance(v, np.ndarray | np.generic))
        return await encode(out, fn, *args)

    monkeypatch.setattr(BodyPool, "take", recording_take)
    monkeypatch.setattr(pipeline, "_encode", recording_encode)
    n = 96  # 96 x 96 float64: 72 KiB, over MIN_POOLED
    rng = np.random.default_rng(3)
    A = rng.standard_normal((n, n)) + n * np.eye(n)
    LU, piv = scipy_lu(A)
    B = rng.standard_normal((n, n))
    cases = [
        ("lu_factor", {"A": A}, {}), ("lu_factor", {"A": A}, {"pivot": False}),
        ("lu_unpack", {"LU": LU, "pivots": piv}, {}), ("lu_unpack", {"LU": LU, "pivots": piv}, {"unpack_data": False}),
        ("lu_unpack", {"LU": LU, "pivots": piv}, {"unpack_pivots": False}),
        ("lu_solve", {"LU": LU, "pivots": piv, "B": B}, {}), ("lu_solve", {"LU": LU, "pivots": piv, "B": B}, {"left": False}),
        ("lu", {"A": A}, {}), ("solve", {"A": A, "B": B}, {}), ("solve", {"A": A, "B": B}, {"left": False}),
        ("solve_refined", {"A": A, "B": B}, {}), ("lu_rcond", {"LU": LU, "pivots": piv, "anorm": np.array(n * 2.0)}, {}),
        ("slogdet", {"A": A}, {}), ("det", {"A": A}, {}),
    ]  # fmt: skip
    for op, tensors, options in cases:
        case = f"{op} {options}"
        taken = len(leased)
        body, headers = binary_request(tensors, options)
        r = await client.post(f"/{op}", content=body, headers=headers)
        assert r.status_code == 200, (op, r.text)
        assert len(leased) > taken, f"{case}: its body was not received into a pooled buffer"
        assert outputs.get(case), f"{case}: no output was seen"
        for name, arr in outputs[case]:
            assert not any(np.shares_memory(arr, buf) for buf in leased), (case, name)
    body, headers = binary_request({"A": A})
    taken = len(leased)
    assert (await client.put("/factorizations/kept", content=body, headers=headers)).status_code == 201
    assert len(leased) > taken
    entry = client.app.state.store.get("", "kept")  # type: ignore[attr-defined]
    assert not any(np.shares_memory(entry.LU, buf) or np.shares_memory(entry.pivots, buf) for buf in leased)


def scipy_lu(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import scipy.linalg

    lu, piv = scipy.linalg.lu_factor(A)
    return lu, (piv + 1).astype(np.int32)
