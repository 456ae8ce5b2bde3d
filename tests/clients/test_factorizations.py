"""``factorize`` and ``RemoteFactorization``: both twins in-process and on loopback, and the CLI."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import httpx
import numpy as np
import pytest

import lu_client
import lu_core
from lu_client._cli import main
from tests.helpers import DTYPES, well_conditioned

pytestmark = pytest.mark.anyio


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


async def _value(x):
    return x


async def _await(x):
    return await x


async def run_all(client, call, rng, dtype):
    A = well_conditioned(rng, (2, 1, 5, 5), dtype)
    LU, piv = lu_core.lu_factor(A)
    fact = await call(client.factorize(A))
    assert re.fullmatch(r"lu-[0-9a-f]{24}", fact.name)
    assert fact.shape == (2, 1, 5, 5) and fact.dtype == np.dtype(dtype) and fact.nbytes == LU.nbytes + piv.nbytes
    same(fact.info, np.zeros((2, 1), np.int32))
    for left, adjoint, shape in [(True, False, (3, 5, 2)), (True, True, (5, 1)), (False, True, (2, 4, 2, 5))]:
        B = rng.standard_normal(shape).astype(dtype)
        same(
            await call(fact.solve(B, left=left, adjoint=adjoint)),
            lu_core.lu_solve(LU, piv, B, left=left, adjoint=adjoint),
        )
    for got, want in zip(await call(fact.unpack()), lu_core.lu_unpack(LU, piv), strict=True):
        same(got, want)
    assert [m["name"] for m in await call(client.list_factorizations())] == [fact.name]
    again = await call(client.factorization(fact.name))
    same(again.info, fact.info)
    await call(fact.delete())
    with pytest.raises(lu_client.FactorizationNotFoundError) as excinfo:
        await call(fact.solve(np.ones((5, 1), dtype)))
    err = excinfo.value
    assert isinstance(err, lu_client.NotFoundError) and err.status_code == 404 and err.code == "unknown_factorization"
    assert "gone" in str(err) and err.request_id
    with pytest.raises(lu_client.FactorizationNotFoundError):
        await call(fact.delete())
    await call(fact.delete(missing_ok=True))
    with pytest.raises(lu_client.FactorizationNotFoundError):
        await call(client.factorization(fact.name))
    named = await call(client.factorize(2 * np.eye(3), name="mine"))
    assert named.name == "mine"
    replaced = await call(client.factorize(4 * np.eye(3, dtype=dtype), name="mine"))
    same(await call(replaced.solve(np.ones((3, 1), dtype))), np.full((3, 1), 0.25, dtype))
    # Names the service would refuse (422 invalid_name), or that a URL would turn into another route ("." the
    # listing, "" a redirect, "a/b" and ".." a 404 of the router): refused here, before any request.
    sent = len(client.transport.requests)
    for bad in ("bad name", "", ".", "..", "a/b", "x" * 129, "é"):
        for method, args in (
            (client.factorize, (np.eye(2),)),
            (client.factorization, ()),
            (client.factorization_metadata, ()),
            (client.solve_factorization, (np.ones((2, 1)),)),
            (client.delete_factorization, ()),
        ):
            with pytest.raises(ValueError, match="factorization name .* is invalid"):
                await call(method(*args, name=bad) if method == client.factorize else method(bad, *args))
    assert len(client.transport.requests) == sent
    with pytest.raises(lu_client.SingularMatrixError):
        await call((await call(client.factorize(np.zeros((2, 2)), name="z"))).solve(np.ones((2, 1))))


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_sync_remote_factorization(make_sync_client, rng, binary, dtype):
    client = make_sync_client({"binary": binary})
    await run_all(client, _value, rng, dtype)
    sent = {(r.method, r.headers.get("content-type")) for r in client.transport.requests}
    media = "application/octet-stream" if binary else "application/json"
    assert ("PUT", media) in sent and ("POST", media) in sent
    named = [r for r in client.transport.requests if r.url.path.startswith("/factorizations/")]
    assert named and all(r.url.path.split("/")[2] == unquote(r.headers["x-lu-factorization"]) for r in named)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
async def test_async_remote_factorization(make_async_client, rng, binary, dtype):
    client = await make_async_client({"binary": binary})
    await run_all(client, _await, rng, dtype)


def test_context_manager_deletes_on_exit(make_sync_client):
    client = make_sync_client()
    with client.factorize(2 * np.eye(4), name="ctx") as fact:
        same(fact.solve(np.ones((4, 1))), np.full((4, 1), 0.5))
    assert client.list_factorizations() == []
    with client.factorize(np.eye(2), name="gone-early") as fact:
        fact.delete()  # already gone on exit: not an error
    with pytest.raises(lu_client.FactorizationNotFoundError):
        fact.solve(np.ones((2, 1)))


async def test_async_context_manager_deletes_on_exit(make_async_client):
    client = await make_async_client()
    async with await client.factorize(2 * np.eye(4), name="ctx") as fact:
        same(await fact.solve(np.ones((4, 1))), np.full((4, 1), 0.5))
    assert await client.list_factorizations() == []


def test_expired_factorization_raises_the_typed_error(make_sync_client):
    client = make_sync_client(store_ttl_s=10)
    fact = client.factorize(np.eye(3))
    # the server's store reads this clock: an hour passes without sleeping
    client.transport.inner.app.state.store.clock = lambda: 1e12
    with pytest.raises(lu_client.FactorizationNotFoundError):
        fact.solve(np.ones((3, 1)))


def test_retries_a_503_on_put_and_solve(make_sync_client):
    """PUT replaces and solves are pure: both are retried on 503 like the other calls."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] % 2:
            return httpx.Response(503, headers={"retry-after": "0"}, json={"error": "busy", "code": "overloaded"})
        if request.method == "PUT":
            return httpx.Response(201, json={"name": "r", "shape": [1, 1], "dtype": "float64", "nbytes": 12})
        return httpx.Response(200, json={"X": {"dtype": "float64", "shape": [1, 1], "data": [[1.0]]}})

    client = lu_client.LUClient("http://lu.test", http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    client._sleep = lambda s: None
    fact = client.factorize(np.eye(1), name="r")
    assert fact.info is None and fact.name == "r"
    same(fact.solve(np.ones((1, 1))), np.ones((1, 1)))
    assert calls["n"] == 4


def test_on_loopback_with_an_api_key(live_server, rng):
    A = well_conditioned(rng, (3, 8, 8), np.float64)
    B = rng.standard_normal((8, 2))
    with lu_client.LUClient(live_server, api_key="live-key") as client:
        with client.factorize(A) as fact:
            same(fact.solve(B), lu_core.lu_solve(*lu_core.lu_factor(A), B))
            name = fact.name
        with pytest.raises(lu_client.FactorizationNotFoundError):
            client.solve_factorization(name, B)
    with lu_client.LUClient(live_server) as anonymous, pytest.raises(lu_client.AuthenticationError):
        anonymous.factorize(A)


async def test_async_on_loopback(live_server, rng):
    A = well_conditioned(rng, (8, 8), np.complex128)
    B = rng.standard_normal((8, 1)).astype(np.complex128)
    async with lu_client.AsyncLUClient(live_server, api_key="live-key") as client:
        async with await client.factorize(A, name="async-loop") as fact:
            same(await fact.solve(B, adjoint=True), lu_core.lu_solve(*lu_core.lu_factor(A), B, adjoint=True))
        assert await client.list_factorizations() == []


def test_cli_store_solve_delete(live_server, monkeypatch, tmp_path, rng, capsys):
    monkeypatch.setenv("LU_URL", live_server)
    monkeypatch.setenv("LU_API_KEY", "live-key")
    A = well_conditioned(rng, (6, 6), np.float64)
    B = rng.standard_normal((6, 3))
    np.save(tmp_path / "A.npy", A)
    np.save(tmp_path / "B.npy", B)
    assert main(["factorization", "store", str(tmp_path / "A.npy"), "--name", "cli-sys"]) == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["name"] == "cli-sys" and meta["shape"] == [6, 6]
    out = tmp_path / "X.npy"
    assert main(["factorization", "solve", "cli-sys", str(tmp_path / "B.npy"), "-o", str(out), "--adjoint"]) == 0
    same(np.load(out), lu_core.lu_solve(*lu_core.lu_factor(A), B, adjoint=True))
    assert main(["factorization", "list"]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)] == ["cli-sys"]
    assert main(["factorization", "show", "cli-sys"]) == 0
    assert json.loads(capsys.readouterr().out)["info"]["data"] == 0
    assert main(["factorization", "delete", "cli-sys"]) == 0
    assert main(["factorization", "delete", "cli-sys"]) == 1
    assert "404 unknown_factorization" in capsys.readouterr().err
    assert main(["factorization", "solve", "cli-sys", str(tmp_path / "B.npy"), "-o", str(out)]) == 1
    assert "gone" in capsys.readouterr().err
    assert main(["factorization", "store", str(tmp_path / "missing.npy")]) == 2
    assert main(["--json", "factorization", "store", str(tmp_path / "A.npy")]) == 0
    name = json.loads(capsys.readouterr().out)["name"]
    assert main(["factorization", "delete", name]) == 0
