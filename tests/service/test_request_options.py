"""Triton's request options: timeout as a deadline (408 deadline_exceeded), priority, the ignored keys."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from service.request_options import Control, earliest, take_control
from tests.service.test_worker import BODY, GatedDevice
from tests.service.wire import binary_request, parse_binary

pytestmark = pytest.mark.anyio

A = [[3.0, 1.0], [1.0, 2.0]]
V2_SOLVE = {
    "inputs": [
        {"name": "A", "shape": [2, 2], "datatype": "FP64", "data": [3.0, 1.0, 1.0, 2.0]},
        {"name": "B", "shape": [2], "datatype": "FP64", "data": [9.0, 8.0]},
    ]
}
TRITON_KEYS = {
    "timeout": 60_000_000,
    "priority": 1,
    "sequence_id": 7,
    "sequence_start": True,
    "sequence_end": False,
    "binary_data_output": False,
    "headers": {"x-extra": "1"},
}


def test_take_control_pops_the_triton_keys_and_keeps_ours():
    options = {**TRITON_KEYS, "left": False}
    control = take_control(options, now=100.0)
    assert options == {"left": False}
    assert control == Control(deadline=160.0, priority=1)
    assert take_control({"timeout": 0}) == Control()  # 0: no deadline, as in Triton
    assert earliest(None, 5.0, 3.0) == 3.0 and earliest(None, None) is None


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None, [1]])
@pytest.mark.parametrize("key", ["timeout", "priority"])
def test_control_values_must_be_non_negative_integers(key, bad):
    with pytest.raises(Exception, match=key) as info:
        take_control({key: bad})
    assert info.value.status == 422 and info.value.code == "invalid_option"


@pytest.mark.parametrize("bad", ["x", 1, None, [True]])
async def test_binary_data_output_must_be_a_boolean_on_native_routes_as_on_v2(client, bad):
    """Native JSON requests ignore binary_data_output (the answer's framing follows the request's), but a
    value that is not a boolean is refused there too (it was accepted; /v2 answers 400 for it)."""
    r = await client.post("/solve", json={"A": A, "B": [9.0, 8.0], "binary_data_output": bad})
    assert r.status_code == 422 and r.json()["code"] == "invalid_option" and "binary_data_output" in r.text
    r = await client.post("/v2/models/solve/infer", json={**V2_SOLVE, "parameters": {"binary_data_output": bad}})
    assert r.status_code == 400 and "binary_data_output" in r.text
    r = await client.post("/solve", json={"A": A, "B": [9.0, 8.0], "binary_data_output": True})
    assert r.status_code == 200 and r.json()["X"]["data"] == [2.0, 3.0]


@pytest.mark.parametrize("key", ["timeout", "priority"])
def test_a_bad_control_value_is_quoted_briefly(key):
    """The client's value appears in the error cut short (``errors.brief``), however long or deep."""
    deep: object = 1
    for _ in range(900):
        deep = [deep]
    for bad in ("x" * 1_000_000, deep, {str(i): i for i in range(10_000)}):
        with pytest.raises(Exception, match=key) as info:
            take_control({key: bad})
        assert info.value.code == "invalid_option" and len(str(info.value)) < 300


async def test_v2_json_and_binary_and_native_accept_every_triton_key(client):
    r = await client.post("/v2/models/solve/infer", json={**V2_SOLVE, "parameters": {**TRITON_KEYS, "left": True}})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [2.0, 3.0]
    params = {**TRITON_KEYS, "binary_data_output": True, "left": True}  # (/v2 honours binary_data_output)
    body, headers = binary_request({"A": np.array(A), "B": np.array([9.0, 8.0])}, params)
    for path in ("/v2/models/solve/infer", "/solve"):
        r = await client.post(path, content=body, headers=headers)
        assert r.status_code == 200, r.text
        _, out = parse_binary(r.content, int(r.headers["inference-header-content-length"]))
        np.testing.assert_array_equal(out["X"], [2.0, 3.0])
    r = await client.post("/solve", json={**BODY, "priority": 2, "timeout": 10**9})
    assert r.status_code == 200 and r.json()["X"]["data"] == [2.0, 3.0]


async def test_unknown_and_invalid_options_stay_422(client):
    r = await client.post("/v2/models/solve/infer", json={**V2_SOLVE, "parameters": {"priorty": 1}})
    assert r.status_code == 422 and r.json()["code"] == "unknown_option"
    r = await client.post("/v2/models/solve/infer", json={**V2_SOLVE, "parameters": {"timeout": "soon"}})
    assert r.status_code == 422 and r.json()["code"] == "invalid_option"
    r = await client.post("/solve", json={**BODY, "priority": -1})
    assert r.status_code == 422 and r.json()["code"] == "invalid_option"


async def test_a_request_still_queued_past_its_timeout_is_dropped_with_408(make_client):
    client = await make_client()
    device = GatedDevice()
    client.app.state.worker.device = device
    running = asyncio.ensure_future(client.post("/solve", json=BODY))
    await asyncio.to_thread(device.started.wait, 10)
    late = asyncio.ensure_future(
        client.post("/v2/models/solve/infer", json={**V2_SOLVE, "parameters": {"timeout": 1000}})
    )
    patient = asyncio.ensure_future(client.post("/solve", json={**BODY, "timeout": 60_000_000}))
    while client.app.state.worker.depth < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.01)  # well past the 1 ms deadline
    device.gate.set()
    first, dropped, kept = await asyncio.gather(running, late, patient)
    assert first.status_code == 200 and kept.status_code == 200
    assert dropped.status_code == 408, dropped.text
    assert dropped.json()["code"] == "deadline_exceeded"
    metrics = (await client.get("/metrics")).text
    assert "lu_deadline_exceeded_total 1.0" in metrics
    assert 'lu_errors_total{code="deadline_exceeded"} 1.0' in metrics
    assert 'lu_compute_seconds_count{device="cpu",operation="solve"} 2.0' in metrics  # the dropped one never ran
