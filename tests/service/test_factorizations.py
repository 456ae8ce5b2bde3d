"""Stored factorizations over HTTP: lifecycle, answers equal to /lu_solve, errors, scoping, limits, races."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
from prometheus_client.utils import floatToGoString

import lu_core
from service.store import ENTRY_OVERHEAD_BYTES
from tests.helpers import DTYPES, well_conditioned
from tests.service.wire import binary_request, from_json_tensor, parse_binary, to_json_tensor

pytestmark = pytest.mark.anyio


def _outputs(r) -> dict[str, np.ndarray | None]:
    assert r.status_code == 200, r.text
    if "inference-header-content-length" in r.headers:
        return parse_binary(r.content, int(r.headers["inference-header-content-length"]))[1]
    return {k: None if v is None else from_json_tensor(v) for k, v in r.json().items()}


async def put(client, name: str, A: np.ndarray, fmt: str = "json", headers: dict | None = None, **options):
    if fmt == "binary":
        body, h = binary_request({"A": A}, options)
        return await client.put(f"/factorizations/{name}", content=body, headers={**h, **(headers or {})})
    return await client.put(f"/factorizations/{name}", json={"A": to_json_tensor(A), **options}, headers=headers)


async def post(client, path: str, tensors: dict, fmt: str = "json", headers: dict | None = None, **options):
    if fmt == "binary":
        body, h = binary_request(tensors, options)
        return await client.post(path, content=body, headers={**h, **(headers or {})})
    body = {**{k: to_json_tensor(v) for k, v in tensors.items()}, **options}
    return await client.post(path, json=body, headers=headers)


async def solve(client, name: str, B: np.ndarray, fmt: str = "json", **options) -> np.ndarray:
    return _outputs(await post(client, f"/factorizations/{name}/solve", {"B": B}, fmt, **options))["X"]


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def error(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code and body["request_id"] and body["error"]
    return body


# --------------------------------------------------------------------------- lifecycle


async def test_lifecycle(client, rng):
    A = well_conditioned(rng, (2, 6, 6), np.float64)
    r = await put(client, "sys.1", A)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/factorizations/sys.1"
    meta = r.json()
    LU, piv = lu_core.lu_factor(A)
    assert meta["name"] == "sys.1" and meta["shape"] == [2, 6, 6] and meta["dtype"] == "float64"
    assert meta["nbytes"] == LU.nbytes + piv.nbytes and meta["pivot"] is True
    same(from_json_tensor(meta["info"]), np.zeros(2, np.int32))
    assert meta["idle_ttl_s"] == 3600 and 3590 < meta["expires_in_s"] <= 3600 and meta["expires_at"].endswith("+00:00")
    # Kept read-only: nothing writes it, and its solves take the kernels' one (read-only) build.
    entry = client.app.state.store.get("", "sys.1")
    assert not entry.LU.flags.writeable and not entry.pivots.flags.writeable
    got = (await client.get("/factorizations/sys.1")).json()
    assert {k: got[k] for k in ("name", "shape", "dtype", "nbytes", "info")} == {
        k: meta[k] for k in ("name", "shape", "dtype", "nbytes", "info")
    }
    listed = (await client.get("/factorizations")).json()["factorizations"]
    assert [m["name"] for m in listed] == ["sys.1"] and "info" not in listed[0]
    r = await put(client, "sys.1", A[:1])  # replace
    assert r.status_code == 200 and r.json()["shape"] == [1, 6, 6]
    assert (await client.delete("/factorizations/sys.1")).status_code == 204
    error(await client.get("/factorizations/sys.1"), 404, "unknown_factorization")
    error(await post(client, "/factorizations/sys.1/solve", {"B": np.ones((6, 1))}), 404, "unknown_factorization")
    error(await client.delete("/factorizations/sys.1"), 404, "unknown_factorization")
    assert (await client.get("/factorizations")).json() == {"factorizations": []}
    assert client.app.state.store.held_bytes == 0


@pytest.mark.parametrize("fmt", ["json", "binary"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_solves_equal_lu_solve(client, rng, fmt, dtype):
    """Bit for bit what /lu_solve answers with /lu_factor's LU and pivots, and what lu_core computes."""
    A = well_conditioned(rng, (2, 1, 5, 5), dtype)
    assert (await put(client, "f", A, fmt)).status_code == 201
    factored = _outputs(await post(client, "/lu_factor", {"A": A}, fmt))
    LU, piv = lu_core.lu_factor(A)
    for left, adjoint, shape in [
        (True, False, (3, 5, 2)),  # broadcast against the batch (2, 1)
        (True, True, (5, 1)),
        (False, False, (2, 3, 4, 5)),
        (False, True, (1, 2, 5)),
    ]:
        B = rng.standard_normal(shape).astype(dtype)
        X = await solve(client, "f", B, fmt, left=left, adjoint=adjoint)
        via_route = _outputs(
            await post(client, "/lu_solve", {"LU": factored["LU"], "pivots": factored["pivots"], "B": B}, fmt,
                       left=left, adjoint=adjoint)
        )["X"]  # fmt: skip
        same(X, via_route)
        same(X, lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint))
    # integer right-hand sides promote as in /lu_solve
    Bi = np.arange(10, dtype=np.int32).reshape(5, 2)
    same(await solve(client, "f", Bi, fmt), lu_core.lu_solve(LU, piv, Bi))


@pytest.mark.parametrize("fmt", ["json", "binary"])
async def test_unpack_equals_lu_unpack(client, rng, fmt):
    A = rng.standard_normal((3, 7, 4))  # rectangular: stored and unpacked fine
    assert (await put(client, "tall", A, fmt)).status_code == 201
    LU, piv = lu_core.lu_factor(A)
    for data, pivots in [(True, True), (False, True), (True, False)]:
        out = _outputs(
            await post(client, "/factorizations/tall/unpack", {}, fmt, unpack_data=data, unpack_pivots=pivots)
        )
        for got, want in zip(
            (out.get("P"), out.get("L"), out.get("U")), lu_core.lu_unpack(LU, piv, data, pivots), strict=True
        ):
            assert (got is None) == (want is None)
            if want is not None:
                same(got, want)
    r = await client.post("/factorizations/tall/unpack")  # an empty body: the defaults
    same(_outputs(r)["L"], lu_core.lu_unpack(LU, piv)[1])
    # a solve needs a square factorization, exactly as /lu_solve does
    error(await post(client, "/factorizations/tall/solve", {"B": np.ones((7, 1))}), 422, "invalid_shape")


async def test_singular_and_unpivoted_factorizations(client, rng):
    A = np.stack([np.eye(3), np.zeros((3, 3))])
    r = await put(client, "sing", A)
    assert r.status_code == 201
    same(from_json_tensor(r.json()["info"]), np.array([0, 1], np.int32))
    body = error(await post(client, "/factorizations/sing/solve", {"B": np.ones((3, 1))}), 422, "singular_matrix")
    assert body["indices"] == [[1]]
    LU, piv, _ = lu_core.lu_factor_ex(A)
    with np.errstate(all="ignore"):
        want = lu_core.lu_solve(LU, piv, np.ones((3, 1)))
    same(await solve(client, "sing", np.ones((3, 1)), check_errors=False), want)
    B = well_conditioned(rng, (4, 4), np.float64)
    assert (await put(client, "nopiv", B, pivot=False)).json()["pivot"] is False
    LU, piv = lu_core.lu_factor(B, pivot=False)
    same(await solve(client, "nopiv", np.ones((4, 2))), lu_core.lu_solve(LU, piv, np.ones((4, 2))))


async def test_empty_and_integer_matrices(client):
    assert (await put(client, "empty", np.zeros((0, 3, 3)))).status_code == 201
    same(await solve(client, "empty", np.zeros((3, 2))), np.zeros((0, 3, 2)))
    r = await client.put("/factorizations/ints", json={"A": [[2, 1], [1, 3]]})
    assert r.status_code == 201 and r.json()["dtype"] == "float64" and r.json()["nbytes"] == 4 * 8 + 2 * 4
    same(await solve(client, "ints", np.array([[3.0], [4.0]])), np.array([[1.0], [1.0]]))


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("path", ["x" * 129, "a%20b", "%C3%A4", "%2E", "%2E%2E", "a*", "a%00"])
async def test_invalid_names_are_422_on_every_route(client, path):
    A = np.eye(2)
    error(await client.put(f"/factorizations/{path}", json={"A": A.tolist()}), 422, "invalid_name")
    error(await client.get(f"/factorizations/{path}"), 422, "invalid_name")
    error(await client.delete(f"/factorizations/{path}"), 422, "invalid_name")
    error(await client.post(f"/factorizations/{path}/solve", json={"B": [[1.0], [1.0]]}), 422, "invalid_name")
    error(await client.post(f"/factorizations/{path}/unpack", json={}), 422, "invalid_name")


async def test_longest_name_is_valid_and_slashes_are_other_routes(client):
    assert (await client.put(f"/factorizations/{'n' * 128}", json={"A": [[1.0]]})).status_code == 201
    assert (await client.put("/factorizations/a/b", json={"A": [[1.0]]})).status_code in (404, 405)
    assert (await client.get("/factorizations")).json()["factorizations"][0]["name"] == "n" * 128


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"A": [[1, 2], [3, 4]', 400, "malformed_json"),
        (b"[1, 2]", 400, "malformed_body"),
        (b'{"A": [[1, 2], [3]]}', 400, "malformed_tensor"),
        (b'{"A": "abc"}', 400, "malformed_tensor"),
        (b'{"A": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400, "malformed_json"),
        (b'{"A": {"dtype": "float64", "shape": [2, 2], "data": [1, 2, 3]}}', 400, "shape_mismatch"),
        (b'{"A": {"dtype": "float16", "data": [[1]]}}', 422, "invalid_dtype"),
        (b'{"pivot": true}', 422, "missing_input"),
        (b'{"A": [[1.0]], "B": [[1.0]]}', 422, "unknown_option"),
        (b'{"A": [[1.0]], "pivot": "yes"}', 422, "invalid_option"),
        (b'{"A": [1.0, 2.0]}', 422, "invalid_shape"),
    ],
)
async def test_malformed_put_bodies(client, body, status, code):
    r = await client.put("/factorizations/x", content=body, headers={"content-type": "application/json"})
    error(r, status, code)
    error(await client.get("/factorizations/x"), 404, "unknown_factorization")  # nothing was stored


async def test_put_binary_and_content_type_errors(client):
    body, headers = binary_request({"A": np.eye(3)})
    error(await client.put("/factorizations/x", content=body[:-8], headers=headers), 400, "truncated_body")
    bad = dict(headers, **{"inference-header-content-length": "9999"})
    error(await client.put("/factorizations/x", content=body, headers=bad), 400, "malformed_header")
    error(await client.put("/factorizations/x", content=b"A=1", headers={"content-type": "text/plain"}), 415,
          "unsupported_media_type")  # fmt: skip
    body, headers = binary_request({"A": np.full((2, 2), np.nan)})
    r = await client.put("/factorizations/nan", content=body, headers=headers)
    assert r.status_code == 201  # non-finite values propagate, as in /lu_factor


async def test_oversized_puts(make_client):
    client = await make_client(max_request_bytes=4096, max_elements=300)
    error(await put(client, "x", np.ones((30, 30)), "binary"), 413, "request_too_large")
    error(await put(client, "x", np.ones((2, 14, 14)), "binary"), 413, "too_many_elements")
    error(await put(client, "x", np.ones((2, 12, 12)), "binary"), 422, "output_too_large")  # as /lu_factor
    error(await put(client, "x", np.ones((1, 15, 15)) / 3), 413, "request_too_large")


async def test_malformed_solve_and_unpack_bodies(client, rng):
    assert (await put(client, "f", well_conditioned(rng, (2, 4, 4), np.float64))).status_code == 201
    path = "/factorizations/f/solve"
    error(await client.post(path, json={"left": True}), 422, "missing_input")
    error(await post(client, path, {"B": np.ones((4, 1)), "LU": np.eye(4)}), 422, "unknown_input")
    error(await post(client, path, {"B": np.ones((4, 1)), "LU": np.eye(4)}, "binary"), 422, "unknown_input")
    error(await post(client, path, {"B": np.ones((5, 1))}), 422, "invalid_shape")
    error(await post(client, path, {"B": np.ones((3, 4, 1))}), 422, "invalid_shape")  # batch 3 vs 2
    error(await post(client, path, {"B": np.ones(4)}), 422, "invalid_shape")
    error(await post(client, path, {"B": np.ones((4, 1))}, adjoint="no"), 422, "invalid_option")
    error(await post(client, path, {"B": np.ones((4, 1))}, transpose=True), 422, "unknown_option")
    error(await client.post(path, content=b"{", headers={"content-type": "application/json"}), 400, "malformed_json")
    error(await client.post(path, content=b'{"B": [[1], [2, 3]]}', headers={"content-type": "application/json"}),
          400, "malformed_tensor")  # fmt: skip
    error(await client.post(path, content=b"", headers={"content-type": "application/json"}), 400, "malformed_json")
    X = await solve(client, "f", np.array([[np.nan], [np.inf], [1.0], [0.0]]))
    assert X.shape == (2, 4, 1) and np.isnan(X).any()  # non-finite input propagates, no error
    unpack = "/factorizations/f/unpack"
    error(await post(client, unpack, {"LU": np.eye(4)}), 422, "unknown_input")
    error(await client.post(unpack, json={"unpack_data": 1}), 422, "invalid_option")


async def test_solve_answers_are_bounded(make_client):
    client = await make_client(max_elements=1000)
    assert (await put(client, "f", np.ones((10, 4, 4)) + 4 * np.eye(4))).status_code == 201
    # 40 elements in, 10 x 30 x 4 x 1 = 1200 out: refused before computing
    error(await post(client, "/factorizations/f/solve", {"B": np.ones((30, 1, 4, 1))}), 422, "output_too_large")


# --------------------------------------------------------------------------- budget, eviction, expiry


async def test_factorization_larger_than_the_store_is_refused_and_evicts_nothing(make_client):
    client = await make_client(store_bytes=4000)
    assert (await put(client, "small", np.eye(4))).status_code == 201
    body = error(await put(client, "big", np.eye(16)), 413, "factorization_too_large")
    assert "4160 bytes (2112 of LU and pivots, 2048 of bookkeeping)" in body["error"]
    assert "LU_STORE_BYTES = 4000" in body["error"]
    assert (await client.get("/factorizations/small")).status_code == 200
    assert client.app.state.store.stats.evictions == 0


async def test_store_zero_stores_nothing(make_client):
    client = await make_client(store_bytes=0)
    error(await put(client, "x", np.eye(1)), 413, "factorization_too_large")


async def test_least_recently_used_is_evicted(make_client):
    one = 8 * 8 * 8 + 8 * 4 + ENTRY_OVERHEAD_BYTES
    client = await make_client(store_bytes=3 * one)
    A = {name: np.eye(8) * (i + 2) for i, name in enumerate("abcd")}
    for name in "abc":
        assert (await put(client, name, A[name])).status_code == 201
    await solve(client, "a", np.ones((8, 1)))  # a is used: b is now the oldest
    assert (await client.get("/factorizations/b")).status_code == 200  # metadata is not a use
    assert (await put(client, "d", A["d"])).status_code == 201
    error(await client.get("/factorizations/b"), 404, "unknown_factorization")
    names = sorted(m["name"] for m in (await client.get("/factorizations")).json()["factorizations"])
    assert names == ["a", "c", "d"]
    same(await solve(client, "a", np.ones((8, 1))), np.full((8, 1), 0.5))
    metrics = (await client.get("/metrics")).text
    assert "lu_store_evictions_total 1.0" in metrics and f"lu_store_bytes {float(3 * one)}" in metrics
    assert "lu_store_entries 3.0" in metrics


async def test_empty_and_tiny_factorizations_count_their_bookkeeping_and_the_entry_cap(make_client):
    """0 x 0 and 1 x 1 factorizations hold 0 and 12 bytes of arrays but about 1.6 KB of host memory each:
    counted with ENTRY_OVERHEAD_BYTES, they evict one another under LU_STORE_BYTES (before, 5000 empty
    ones fit in 4096 bytes, and the listing grew with them), and LU_STORE_MAX_ENTRIES caps the number."""
    client = await make_client(store_bytes=4 * ENTRY_OVERHEAD_BYTES + 100, store_max_entries=1000)
    empty = {"A": {"dtype": "float64", "shape": [0, 0], "data": []}}
    for i in range(12):
        r = await client.put(f"/factorizations/{'n' * 100}{i}", json=empty if i % 2 else {"A": [[2.0]]})
        assert r.status_code == 201, r.text
    store = client.app.state.store
    assert store.stats.entries == 4 and store.stats.evictions == 8
    assert store.stats.bytes <= store.limit_bytes
    listed = (await client.get("/factorizations")).json()["factorizations"]
    assert [m["name"] for m in listed] == [f"{'n' * 100}{i}" for i in (11, 10, 9, 8)]
    assert listed[0]["nbytes"] == 0 and listed[1]["nbytes"] == 12  # the metadata: LU and pivots alone

    capped = await make_client(store_max_entries=3)
    for i in range(5):
        assert (await capped.put(f"/factorizations/e{i}", json=empty)).status_code == 201
    names = [m["name"] for m in (await capped.get("/factorizations")).json()["factorizations"]]
    assert names == ["e4", "e3", "e2"] and capped.app.state.store.stats.evictions == 2
    assert (await capped.put("/factorizations/e3", json=empty)).status_code == 200  # a replace evicts nothing
    assert capped.app.state.store.stats.evictions == 2
    none = await make_client(store_max_entries=0)
    body = error(await none.put("/factorizations/x", json=empty), 413, "factorization_too_large")
    assert "LU_STORE_MAX_ENTRIES = 0" in body["error"]


async def test_idle_factorizations_expire(make_client):
    client = await make_client(store_ttl_s=100)
    store = client.app.state.store
    now = [0.0]
    store.clock = lambda: now[0]
    assert (await put(client, "a", np.eye(2))).status_code == 201
    assert (await put(client, "b", np.eye(2))).status_code == 201
    now[0] = 60
    await solve(client, "a", np.ones((2, 1)))
    assert (await client.get("/factorizations/b")).json()["expires_in_s"] == pytest.approx(40)
    now[0] = 110  # b idle for 110 s, a for 50 s
    error(await post(client, "/factorizations/b/solve", {"B": np.ones((2, 1))}), 404, "unknown_factorization")
    assert (await client.get("/factorizations/a")).json()["expires_in_s"] == pytest.approx(50)
    now[0] = 1000
    metrics = (await client.get("/metrics")).text  # a scrape expires (and frees) idle entries too
    assert "lu_store_expiries_total 2.0" in metrics and "lu_store_entries 0.0" in metrics
    assert store.held_bytes == 0


async def test_metrics_count_hits_and_misses(client):
    await put(client, "m", np.eye(2))
    await solve(client, "m", np.ones((2, 1)))
    await client.get("/factorizations/m")
    await client.get("/factorizations/nope")
    await client.post("/factorizations/nope/solve", json={"B": [[1.0], [1.0]]})
    text = (await client.get("/metrics")).text
    assert "lu_store_hits_total 2.0" in text and "lu_store_misses_total 2.0" in text
    assert 'lu_errors_total{code="unknown_factorization"} 2.0' in text
    limit = min(1 << 30, client.app.state.settings.max_inflight_bytes // 2)  # the CPU default
    assert f"lu_store_limit_bytes {floatToGoString(limit)}" in text


# --------------------------------------------------------------------------- API keys


async def test_factorizations_are_scoped_to_the_api_key(make_client):
    client = await make_client(api_key="key-one,key-two")
    one, two = {"authorization": "Bearer key-one"}, {"authorization": "Bearer key-two"}
    error(await put(client, "x", np.eye(2)), 401, "unauthorized")
    error(await client.get("/factorizations"), 401, "unauthorized")
    assert (await put(client, "x", 2 * np.eye(2), headers=one)).status_code == 201
    error(await client.get("/factorizations/x", headers=two), 404, "unknown_factorization")
    error(await client.delete("/factorizations/x", headers=two), 404, "unknown_factorization")
    r = await post(client, "/factorizations/x/solve", {"B": np.ones((2, 1))}, headers=two)
    error(r, 404, "unknown_factorization")
    assert (await client.get("/factorizations", headers=two)).json() == {"factorizations": []}
    assert (await put(client, "x", 4 * np.eye(2), headers=two)).status_code == 201  # its own x
    r1 = await post(client, "/factorizations/x/solve", {"B": np.ones((2, 1))}, headers=one)
    r2 = await post(client, "/factorizations/x/solve", {"B": np.ones((2, 1))}, "binary", headers=two)
    same(_outputs(r1)["X"], np.full((2, 1), 0.5))
    same(_outputs(r2)["X"], np.full((2, 1), 0.25))
    assert (await client.delete("/factorizations/x", headers=two)).status_code == 204
    assert (await client.get("/factorizations/x", headers=one)).status_code == 200


# --------------------------------------------------------------------------- races


async def test_solves_racing_replace_and_delete_get_old_new_or_404(client, rng):
    """Every answer is exactly one factorization's solve (never a mixture), or 404 after the delete."""
    n = 40
    A1, A2 = well_conditioned(rng, (3, n, n), np.float64), well_conditioned(rng, (3, n, n), np.float64)
    B = rng.standard_normal((3, n, 2))
    X1, X2 = (lu_core.lu_solve(*lu_core.lu_factor(a), B) for a in (A1, A2))
    assert (await put(client, "race", A1, "binary")).status_code == 201

    async def solver() -> list:
        seen = []
        for _ in range(8):
            r = await post(client, "/factorizations/race/solve", {"B": B}, "binary")
            if r.status_code == 404:
                seen.append("gone")
                continue
            X = _outputs(r)["X"]
            seen.append("old" if np.array_equal(X, X1) else "new" if np.array_equal(X, X2) else "torn")
        return seen

    async def writer() -> None:
        for i in range(6):
            assert (await put(client, "race", A2 if i % 2 == 0 else A1, "binary")).status_code == 200
        await put(client, "race", A2, "binary")
        await asyncio.sleep(0)
        assert (await client.delete("/factorizations/race")).status_code == 204

    results = await asyncio.gather(*(solver() for _ in range(4)), writer())
    seen = [s for r in results[:4] for s in r]
    assert "torn" not in seen and {"old", "new"} & set(seen)
    assert client.app.state.store.held_bytes == 0  # nothing left behind once the solves finished


async def test_a_queued_solve_keeps_its_factorization_through_a_delete(client, rng):
    """Pinned before the delete, the solve answers with the factorization; its memory is freed after."""
    A = well_conditioned(rng, (4, 4), np.float64)
    assert (await put(client, "held", A)).status_code == 201
    store, worker = client.app.state.store, client.app.state.worker
    entry = store.get("", "held")
    gate, started = threading.Event(), threading.Event()

    def blocker(t, o):
        started.set()
        gate.wait(30)
        return {}

    block = asyncio.ensure_future(worker.submit("block", blocker, {}, {}))
    await asyncio.to_thread(started.wait, 30)
    pending = asyncio.ensure_future(solve(client, "held", np.ones((4, 1))))
    while entry.pins == 0:  # the solve has found its entry and waits for the worker
        await asyncio.sleep(0.001)
    assert (await client.delete("/factorizations/held")).status_code == 204
    assert not entry.freed and store.held_bytes == entry.nbytes and store.stats.bytes == 0
    gate.set()
    await block
    X = await pending
    same(X, lu_core.lu_solve(*lu_core.lu_factor(A), np.ones((4, 1))))
    assert entry.freed and store.held_bytes == 0 and store.stats.freed_late == 1


async def test_openapi_documents_the_routes(client):
    doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    assert set(paths["/factorizations/{name}"]) == {"put", "get", "delete"}
    assert "post" in paths["/factorizations/{name}/solve"] and "get" in paths["/factorizations"]
    props = paths["/factorizations/{name}/solve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(props["properties"]) == {"B", "left", "adjoint", "check_errors"}
    assert json.dumps(paths["/factorizations/{name}"]["put"]["responses"]["201"])


async def _settles(budget, expected: int, pool=None) -> None:
    """``budget.in_use`` reaches ``expected`` once the requests' own reservations are let go (after the answer).

    ``pool``: the app's receive-buffer pool, whose idle buffers are reserved in the budget too (not counted here).
    """

    def held() -> int:
        return budget.in_use - (pool.held_bytes if pool is not None else 0)

    for _ in range(500):
        if held() == expected:
            return
        await asyncio.sleep(0.01)
    assert held() == expected


async def test_stored_bytes_are_held_in_the_memory_budget(make_client):
    """Each stored factorization holds a reservation of its bytes until its memory is freed."""
    client = await make_client()
    budget = client.app.state.budget
    assert client.app.state.store.budget is budget
    await _settles(budget, 0)
    assert (await put(client, "a", np.eye(16))).status_code == 201
    await _settles(budget, 16 * 16 * 8 + 16 * 4 + ENTRY_OVERHEAD_BYTES)  # its bookkeeping too
    assert (await put(client, "a", np.eye(8))).status_code == 200  # the old reservation goes with the old entry
    await _settles(budget, 8 * 8 * 8 + 8 * 4 + ENTRY_OVERHEAD_BYTES)
    assert (await client.delete("/factorizations/a")).status_code == 204
    await _settles(budget, 0)


async def test_the_store_default_leaves_half_the_memory_budget_to_requests(make_client):
    client = await make_client(max_inflight_bytes=1 << 20)
    assert client.app.state.store.limit_bytes == 1 << 19


async def test_stored_factorizations_cannot_starve_the_memory_budget(make_client, rng):
    """The store's reservations count against LU_MAX_INFLIGHT_BYTES: when full, a PUT is a 503 to retry."""
    client = await make_client(max_inflight_bytes=8 << 20, store_bytes=1 << 30)
    budget = client.app.state.budget
    A = well_conditioned(rng, (256, 256), np.float64)  # 512 KiB stored each
    stored = 0
    while True:
        r = await put(client, f"m{stored}", A, "binary")
        if r.status_code != 201:
            break
        stored += 1
    error(r, 503, "overloaded")
    assert r.headers["retry-after"] and 4 <= stored <= 16
    await _settles(budget, stored * (256 * 256 * 8 + 256 * 4 + ENTRY_OVERHEAD_BYTES), client.app.state.bodies)
    assert (await client.delete("/factorizations/m0")).status_code == 204
    assert (await client.delete("/factorizations/m1")).status_code == 204
    assert (await put(client, "again", A, "binary")).status_code == 201  # room again
    for name in [f"m{i}" for i in range(2, stored)] + ["again"]:
        assert (await client.delete(f"/factorizations/{name}")).status_code == 204
    await _settles(budget, 0, client.app.state.bodies)


async def test_concurrent_puts_are_never_merged_by_the_batcher(make_client, rng):
    """Dynamic batching merges same-shape jobs; each stored factorization must still be its own."""
    client = await make_client(max_batch=64, batch_delay_us=20000)
    As = [well_conditioned(rng, (5, 5), np.float64) for _ in range(6)]
    rs = await asyncio.gather(*(put(client, f"p{i}", A, "binary") for i, A in enumerate(As)))
    assert [r.status_code for r in rs] == [201] * 6
    B = np.ones((5, 1))
    Xs = await asyncio.gather(*(solve(client, f"p{i}", B, "binary") for i in range(6)))
    for A, X in zip(As, Xs, strict=True):
        same(X, lu_core.lu_solve(*lu_core.lu_factor(A), B))
