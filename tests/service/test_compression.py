"""Content-Encoding gzip and deflate on every POST route, bounded in inflated bytes (the bomb is a 413)."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib

import numpy as np
import pytest

import lu_core
from service.compression import Inflater, inflater_for
from service.errors import ServiceError
from tests.service.wire import binary_request, parse_binary

pytestmark = pytest.mark.anyio

MiB = 1 << 20


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


CODINGS = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,  # the zlib format, as RFC 9110 and tritonclient mean it
    "deflate-raw": raw_deflate,  # sent as "deflate" by some clients
}


def bomb(inflated: int) -> bytes:
    """A gzip body of ``inflated`` zero bytes (about 1000x smaller)."""
    c = zlib.compressobj(9, wbits=16 + zlib.MAX_WBITS)
    block = bytes(MiB)
    return b"".join(c.compress(block) for _ in range(inflated // MiB)) + c.flush()


@pytest.mark.parametrize("coding", list(CODINGS))
async def test_every_route_and_format_accepts_compressed_bodies(client, rng, coding):
    header = coding.removesuffix("-raw")
    A = rng.standard_normal((3, 5, 5)) + 5 * np.eye(5)
    B = rng.standard_normal((3, 5, 2))
    X = lu_core.solve(A, B)
    compress = CODINGS[coding]
    # native JSON
    r = await client.post("/solve", content=compress(json.dumps({"A": A.tolist(), "B": B.tolist()}).encode()),
                          headers={"content-type": "application/json", "content-encoding": header})  # fmt: skip
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array(r.json()["X"]["data"]), X)
    # native and /v2 binary
    body, headers = binary_request({"A": A, "B": B})
    for path in ("/solve", "/v2/models/solve/infer"):
        r = await client.post(path, content=compress(body), headers={**headers, "content-encoding": header})
        assert r.status_code == 200, r.text
        _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
        np.testing.assert_array_equal(out["X"], X)
    # /v2 JSON
    v2 = {"inputs": [{"name": "A", "shape": list(A.shape), "datatype": "FP64", "data": A.ravel().tolist()},
                     {"name": "B", "shape": list(B.shape), "datatype": "FP64", "data": B.ravel().tolist()}]}  # fmt: skip
    r = await client.post("/v2/models/solve/infer", content=compress(json.dumps(v2).encode()),
                          headers={"content-encoding": header})  # fmt: skip
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"]).reshape(X.shape), X)


async def test_a_bomb_is_413_without_being_inflated_whole(make_client):
    client = await make_client(max_request_bytes=MiB)
    body = bomb(64 * MiB)
    assert len(body) < 100_000
    r = await client.post("/lu_factor", content=body, headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and r.json()["code"] == "request_too_large", r.text
    assert "inflates past" in r.json()["error"]


def test_the_inflater_stops_at_the_bound():
    body = bomb(128 * MiB)
    inflater = Inflater("gzip", limit=2 * MiB)
    tracemalloc.start()
    try:

        def feed_all() -> None:
            for i in range(0, len(body), 65536):
                inflater.feed(body[i : i + 65536])

        with pytest.raises(ServiceError) as info:
            feed_all()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.value.status == 413
    assert inflater.produced <= 2 * MiB
    assert peak < 8 * MiB  # what was kept, plus one step of at most the bound: never 128 MiB


def test_the_inflater_reports_growth_to_a_budget():
    grown: list[int] = []
    inflater = Inflater("deflate", limit=MiB, reserve=grown.append)
    data = zlib.compress(bytes(300_000))
    for i in range(0, len(data), 7):  # tiny chunks, the zlib header split across two
        inflater.feed(data[i : i + 7])
    assert bytes(inflater.finish()) == bytes(300_000)
    assert sum(grown) == 300_000


def test_nothing_is_inflated_past_one_step_before_it_is_reserved():
    """Each decompress call makes at most STEP bytes, which are reserved before the next call: a 61 KB chunk
    of a bomb made a 60 MiB bytes object before anything reserved it (16 at once: 780 MiB over a 512 MiB
    budget; found by a helper's audit). (The kept buffer's growth, up to twice its size while it moves,
    is within the 3x that a binary body's inflated bytes reserve.)"""
    from service.compression import STEP

    grown: list[int] = []
    inflater = Inflater("gzip", limit=64 * MiB, reserve=grown.append)
    inflater.feed(bomb(40 * MiB))  # the whole bomb in one chunk
    inflater.finish()
    assert inflater.produced == sum(grown) == 40 * MiB
    assert max(grown) <= STEP and len(grown) >= 40


def test_concatenated_gzip_members_are_one_body():
    inflater = Inflater("gzip", limit=MiB)
    inflater.feed(gzip.compress(b"abc") + gzip.compress(b"def"))
    assert inflater.finish() == b"abcdef"


@pytest.mark.parametrize(
    ("encoding", "body", "status", "code"),
    [
        ("br", b"\x0b\x02\x80{}\x03", 415, "unsupported_encoding"),
        ("gzip, gzip", gzip.compress(gzip.compress(b"{}")), 415, "unsupported_encoding"),
        ("compress", b"x", 415, "unsupported_encoding"),
        ("gzip", b"not gzip at all", 400, "malformed_body"),
        ("gzip", gzip.compress(b'{"A": [[1.0]]}')[:-6], 400, "truncated_body"),
        ("deflate", zlib.compress(b'{"A": [[1.0]]}') + b"junk", 400, "malformed_body"),
        ("deflate", b"x", 400, "truncated_body"),
        ("gzip", gzip.compress(b"{"), 400, "malformed_json"),
    ],
)
async def test_bad_encodings_and_corrupt_streams(client, encoding, body, status, code):
    for path in ("/lu_factor", "/v2/models/lu_factor/infer"):
        r = await client.post(path, content=body, headers={"content-encoding": encoding})
        assert r.status_code == status and r.json()["code"] == code, (path, r.text)


def test_identity_needs_no_inflater():
    assert inflater_for(None, 10) is None
    assert inflater_for("identity", 10) is None
    assert inflater_for(" GZIP ", 10).encoding == "gzip"


async def test_inflated_json_is_bounded_by_the_json_limit_and_reserved(make_client):
    client = await make_client(max_json_bytes=64 * 1024)
    text = json.dumps({"A": np.eye(100).tolist()}).encode()  # ~40 kB of JSON; the next ~160 kB
    big = json.dumps({"A": np.eye(200).tolist()}).encode()
    assert len(text) < 64 * 1024 < len(big)
    r = await client.post("/lu_factor", content=gzip.compress(text), headers={"content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    r = await client.post("/lu_factor", content=gzip.compress(big), headers={"content-encoding": "gzip"})
    assert r.status_code == 413 and "LU_MAX_JSON_BYTES" in r.json()["error"]
    assert client.app.state.budget.in_use == 0


async def test_inflated_bytes_count_against_the_in_flight_budget(make_client):
    client = await make_client(max_inflight_bytes=8 * MiB)
    A = np.eye(600)  # 2.9 MB raw, reserved at 3x once inflated: past 8 MiB
    body, headers = binary_request({"A": A})
    assert len(gzip.compress(body)) < 100_000
    r = await client.post("/lu_factor", content=gzip.compress(body), headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 413 and r.json()["code"] == "request_too_large", r.text  # more than the whole budget
    assert "inflated body" in r.json()["error"]
    body, headers = binary_request({"A": np.eye(300)})  # 0.7 MB, reserved 3x: fits the budget, not what is left
    held = client.app.state.budget.reserve(6 * MiB)
    try:
        r = await client.post(
            "/lu_factor", content=gzip.compress(body), headers={**headers, "content-encoding": "gzip"}
        )
    finally:
        held.release()
    assert r.status_code == 503 and r.json()["code"] == "overloaded", r.text
    assert "inflated body" in r.json()["error"] and r.headers["retry-after"]
    assert client.app.state.budget.in_use == 0
