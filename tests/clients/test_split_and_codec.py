"""Batches over the server's limits are split and stitched; the client codec agrees with the server's."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

import lu_core
from lu_client._codec import decode_response, encode_binary, encode_json
from service.codec import decode_binary, decode_native_json, encode_native_json
from service.codec import encode_binary as server_encode_binary
from tests.helpers import DTYPES, well_conditioned

pytestmark = pytest.mark.anyio


def test_a_batch_over_the_byte_limit_is_split_after_a_413(make_sync_client, rng):
    client = make_sync_client(max_request_bytes=64 << 10)  # the client does not know the limit yet
    A = well_conditioned(rng, (300, 8, 8), np.float64)  # 150 KiB
    LU, piv = client.lu_factor(A)
    np.testing.assert_array_equal(LU, lu_core.lu_factor(A)[0])
    np.testing.assert_array_equal(piv, lu_core.lu_factor(A)[1])
    posts = [r for r in client.transport.requests if r.method == "POST"]
    assert len(posts) >= 4  # the refused one, then at least three pieces
    assert all(int(r.headers["content-length"]) <= 64 << 10 for r in posts[1:])


def test_broadcast_solves_split_along_the_broadcast_axis(make_sync_client, rng):
    progress = []
    client = make_sync_client({"max_request_bytes": 20_000, "on_progress": lambda d, t: progress.append((d, t))})
    LU, piv = lu_core.lu_factor(well_conditioned(rng, (1, 4, 6, 6), np.float64))
    B = rng.standard_normal((400, 1, 6, 3))
    X = client.lu_solve(LU, piv, B)
    np.testing.assert_array_equal(X, lu_core.lu_solve(LU, piv, B))
    assert X.shape == (400, 4, 6, 3) and len(progress) > 1 and progress[-1][0] == progress[-1][1]


def test_the_element_limit_of_answers_splits_lu_unpack(make_sync_client, rng):
    client = make_sync_client(max_elements=5000)
    LU, piv = lu_core.lu_factor(well_conditioned(rng, (6, 20, 20), np.float64))  # 2400 in, 7200 out
    P, L, U = client.lu_unpack(LU, piv)  # refused as output_too_large, then split
    for got, want in zip((P, L, U), lu_core.lu_unpack(LU, piv), strict=True):
        np.testing.assert_array_equal(got, want)
    statuses = [r for r in client.transport.requests if r.method == "POST"]
    assert len(statuses) >= 3


async def test_async_pieces_go_out_concurrently_but_bounded(make_async_client, rng):
    client = await make_async_client({"max_request_bytes": 10_000, "max_concurrency": 3})
    in_flight, peak = 0, 0
    real_send = client._send

    async def counting(call):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        try:
            return await real_send(call)
        finally:
            in_flight -= 1

    client._send = counting
    A = well_conditioned(rng, (200, 6, 6), np.float64)
    X = await client.solve(A, np.ones((200, 6)))
    np.testing.assert_array_equal(X, lu_core.solve(A, np.ones((200, 6))))
    assert peak == 3


@pytest.mark.parametrize("dtype", [*DTYPES, np.int32, np.int64])
@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (2, 3), (2, 1, 3, 3), ()])
def test_codecs_agree_in_both_directions(rng, dtype, shape):
    arr = (rng.standard_normal(shape) * 10).astype(dtype)
    if np.dtype(dtype).kind in "fc" and arr.size:
        arr.reshape(-1)[0] = np.nan
        arr.reshape(-1)[-1] = -np.inf
    other = np.arange(4, dtype=np.int32)
    enc = encode_binary({"A": arr, "pivots": other}, {"left": False})
    body = b"".join(bytes(c) for c in enc.chunks)
    dec = decode_binary(body, enc.headers["inference-header-content-length"], 1 << 30)
    np.testing.assert_array_equal(dec.tensors["A"], arr)
    assert dec.tensors["A"].dtype == arr.dtype and dec.options == {"left": False}
    enc = encode_json({"A": arr}, {"pivot": True})
    dec = decode_native_json(b"".join(enc.chunks), ("A",), 1 << 30)
    np.testing.assert_array_equal(dec.tensors["A"], arr)
    assert dec.tensors["A"].dtype == arr.dtype and dec.options == {"pivot": True}
    server = server_encode_binary({"X": arr, "n": other})
    out = decode_response(b"".join(bytes(c) for c in server.chunks), {k.lower(): v for k, v in server.headers.items()})
    np.testing.assert_array_equal(out["X"], arr)
    assert out["X"].dtype == arr.dtype and out["X"].shape == arr.shape
    native = encode_native_json({"X": arr, "none": None})
    out = decode_response(b"".join(native.chunks), {})
    np.testing.assert_array_equal(out["X"], arr)
    assert "none" in out and out.get("none") is None and out["X"].dtype == arr.dtype
    v2_json = server_encode_binary({"X": arr}, binary={"*": False}, header_fields={"model_name": "m"})
    out = decode_response(v2_json.chunks[0], {})
    np.testing.assert_array_equal(out["X"], arr)
    assert json.loads(v2_json.chunks[0])["model_name"] == "m"
