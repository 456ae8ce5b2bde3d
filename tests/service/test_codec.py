"""The wire codec on its own: both JSON forms, the binary framing, zero-copy decoding, encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from service.codec import decode_binary, decode_native_json, decode_v2_json, encode_binary, encode_native_json
from service.errors import ServiceError
from tests.helpers import DTYPES
from tests.service.wire import binary_request, from_json_tensor, parse_binary, to_json_tensor

BIG = 1 << 30


def test_binary_decoding_is_zero_copy_views_over_the_body(rng):
    A, piv = rng.standard_normal((3, 4, 4)), np.array([[1, 2, 3, 4]] * 3, np.int32)
    body, headers = binary_request({"A": A, "pivots": piv}, {"left": False})
    decoded = decode_binary(body, headers["inference-header-content-length"], BIG)
    assert decoded.binary and decoded.options == {"left": False}
    for name, want in (("A", A), ("pivots", piv)):
        got = decoded.tensors[name]
        np.testing.assert_array_equal(got, want)
        assert got.base is not None and not got.flags.owndata and not got.flags.writeable
        assert np.shares_memory(got, np.frombuffer(body, np.uint8))


def test_binary_inputs_may_mix_inline_json():
    header = {"inputs": [{"name": "A", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}]}
    raw = json.dumps(header).encode()
    decoded = decode_binary(raw, len(raw), BIG)
    assert decoded.tensors["A"].dtype == np.float32 and decoded.tensors["A"].tolist() == [[1.5, 2.5]]


def test_native_json_forms():
    body = json.dumps(
        {
            "A": [[1, 2], [3, 4]],
            "pivots": [2, 2],
            "B": {"dtype": "complex64", "shape": [2, 1], "data": [[[1, 2]], [[3, "-Infinity"]]]},
            "left": False,
        }
    ).encode()
    d = decode_native_json(body, ("A", "pivots", "B"), BIG)
    assert d.tensors["A"].dtype == np.float64 and d.tensors["pivots"].dtype == np.int64
    assert d.tensors["B"].dtype == np.complex64 and d.tensors["B"][1, 0] == complex(3, -np.inf)
    assert d.options == {"left": False}


def test_v2_json_decoding_and_output_flags():
    body = json.dumps(
        {
            "id": "7",
            "inputs": [{"name": "A", "shape": [2, 2], "datatype": "FP64", "data": [1, "NaN", 3, 4]}],
            "outputs": [{"name": "LU", "parameters": {"binary_data": True}}],
            "parameters": {"pivot": True},
        }
    ).encode()
    d = decode_v2_json(body, BIG)
    assert d.request_id == "7" and d.outputs == ["LU"] and d.binary_outputs["LU"] is True
    assert np.isnan(d.tensors["A"][0, 1]) and d.options == {"pivot": True}


@pytest.mark.parametrize("dtype", [*DTYPES, np.int32])
def test_encoders_round_trip_through_the_test_wire(dtype):
    arr = np.arange(12, dtype=dtype).reshape(2, 3, 2)
    if np.dtype(dtype).kind in "fc":
        arr[0, 0, 0] = np.nan
        arr[1, 2, 1] = -np.inf
    out = json.loads(b"".join(encode_native_json({"X": arr, "none": None}).chunks))
    assert out["none"] is None
    np.testing.assert_array_equal(from_json_tensor(out["X"]), arr)
    encoded = encode_binary({"X": arr, "n": np.array(5, np.int32)}, header_fields={"model_name": "m"})
    header, parsed = parse_binary(
        b"".join(bytes(c) for c in encoded.chunks), int(encoded.headers["Inference-Header-Content-Length"])
    )
    assert header["model_name"] == "m"
    np.testing.assert_array_equal(parsed["X"], arr)
    assert parsed["n"].shape == () and parsed["n"] == 5


def test_json_only_outputs_need_no_framing():
    encoded = encode_binary({"X": np.ones(2)}, binary={"*": False})
    assert encoded.media_type == "application/json" and not encoded.headers
    assert json.loads(encoded.chunks[0])["outputs"][0]["data"] == [1.0, 1.0]


@given(
    hnp.arrays(
        st.sampled_from([np.float32, np.float64, np.complex64, np.complex128]),
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4),
        elements={"allow_nan": True, "allow_infinity": True},
    )
)
def test_json_object_form_round_trips_any_array(arr):
    body = json.dumps({"A": to_json_tensor(arr)}).encode()
    got = decode_native_json(body, ("A",), BIG).tensors["A"]
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)
    back = from_json_tensor(json.loads(b"".join(encode_native_json({"A": got}).chunks))["A"])
    np.testing.assert_array_equal(back, arr)


@given(st.binary(max_size=200), st.integers(-5, 300))
def test_arbitrary_bytes_never_escape_as_anything_but_a_service_error(blob, header_length):
    statuses = []
    for decode in (
        lambda: decode_binary(blob, header_length, 1000),
        lambda: decode_native_json(blob, ("A", "B"), 1000),
        lambda: decode_v2_json(blob, 1000),
    ):
        try:
            decode()
        except ServiceError as exc:
            statuses.append(exc.status)
    assert set(statuses) <= {400, 413, 422}
