"""The memory the budget reserves for a request is an upper bound of what serving it takes.

Measured with tracemalloc (NumPy reports its buffers to it) over decode -> prepare ->
compute -> encode, the path of every request, for every operation, dtype and format,
including JSON written to take the most memory per byte of text.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc

import numpy as np
import pytest

import lu_core
from service.codec import decode_binary, decode_native_json, encode_binary, encode_native_json
from service.errors import ServiceError
from service.footprint import JSON_SLACK, answer_bytes, body_bytes, json_structure_bytes, work_elements
from service.operations import OPERATIONS
from tests.service.wire import binary_request, to_json_tensor

LIMIT = 1 << 30


def tensors_for(op: str, dtype, b: int, n: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    A = rng.standard_normal((b, n, n)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        A = A + 1j * rng.standard_normal((b, n, n)).astype(dtype)
    B = rng.standard_normal((b, n, k)).astype(dtype)
    LU, piv = lu_core.lu_factor(A)
    LU = np.ascontiguousarray(LU)
    anorm = np.abs(A).sum(axis=-2).max(axis=-1).real.astype(np.float64)
    return {
        "solve_refined": {"A": A, "B": B},
        "lu_rcond": {"LU": LU, "pivots": piv, "anorm": anorm},
        "slogdet": {"A": A},
        "det": {"A": A},
        "lu_factor": {"A": A},
        "lu": {"A": A},
        "lu_unpack": {"LU": LU, "pivots": piv},
        "lu_solve": {"LU": LU, "pivots": piv, "B": B},
        "solve": {"A": A, "B": B},
    }[op]


def serve_traced(
    op_name: str, fmt: str, body: bytes, header_length: str | None, answer: str | None = None
) -> tuple[int, int]:
    """(peak bytes, reserved bytes) of serving ``body`` in-process, as the pipeline does; ``answer``: the answer's
    format where it is not the body's (a binary request asking for JSON outputs, ``binary_data_output: false``)."""
    answer = answer or fmt
    op = OPERATIONS[op_name]
    buffer = bytearray(body)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        if fmt == "binary":
            decoded = decode_binary(buffer, header_length, LIMIT)
        else:
            decoded = decode_native_json(buffer, op.inputs, LIMIT)
        options = op.prepare(decoded.tensors, decoded.options, LIMIT)
        itemsize = max((t.dtype.itemsize for t in decoded.tensors.values() if t.dtype.kind in "fc"), default=8)
        reserved = body_bytes(fmt, len(body)) + answer_bytes(
            answer, op.output_elements(decoded.tensors, options), itemsize
        )
        outputs = op.compute(decoded.tensors, options)
        if answer == fmt:
            encoded = (encode_binary if fmt == "binary" else encode_native_json)(outputs)
        else:
            encoded = encode_binary(outputs, binary={"*": False})
        peak = tracemalloc.get_traced_memory()[1] - base
        del encoded, outputs, decoded
    finally:
        tracemalloc.stop()
    return peak + len(body), reserved  # the body buffer was allocated before tracing began


CASES = [(b, n, k) for b, n, k in ((3, 64, 1), (1, 96, 40), (500, 8, 1), (40, 1, 1))]


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("fmt", ["binary", "json"])
def test_reservation_bounds_the_peak(op, dtype, fmt):
    for b, n, k in CASES:
        tensors = tensors_for(op, dtype, b, n, k)
        if fmt == "binary":
            body, headers = binary_request(tensors)
            length = headers["inference-header-content-length"]
        else:
            body, length = json.dumps({name: to_json_tensor(t) for name, t in tensors.items()}).encode(), None
        serve_traced(op, fmt, body, length)  # first call: imports and caches, not the request's
        peak, reserved = serve_traced(op, fmt, body, length)
        assert peak <= reserved, (op, np.dtype(dtype).name, fmt, (b, n, k), peak, reserved)


@pytest.mark.parametrize("op", sorted(OPERATIONS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_reservation_bounds_a_binary_request_answered_in_json(op, dtype, nonfinite):
    """A binary request whose answer is JSON (OIP's binary_data_output: false), its outputs finite or not (a NaN
    in the input spreads through them): what the JSON answer's factor reserves bounds the peak. It did not
    (found by a helper's audit): non-finite values were written through Python floats and lists (up to 5x
    the reservation), and complex pairs through orjson's per-row buffers (1.3x)."""
    for b, n, k in [*CASES, (3, 200, 5)]:
        tensors = tensors_for(op, dtype, b, n, k)
        if nonfinite:
            name = "A" if "A" in tensors else "LU"
            tensors[name] = tensors[name].copy()
            tensors[name].reshape(-1)[0] = np.nan
        body, headers = binary_request(tensors)
        length = headers["inference-header-content-length"]
        try:
            serve_traced(op, "binary", body, length, "json")
        except lu_core.SingularMatrixError:  # (solve's check, with the NaN: nothing to answer)
            continue
        peak, reserved = serve_traced(op, "binary", body, length, "json")
        assert peak <= reserved, (op, np.dtype(dtype).name, nonfinite, (b, n, k), peak, reserved)


@pytest.mark.parametrize(
    "text",
    [
        '{"A": [' + ",".join(["[[0]]"] * 20000) + "]}",  # a list per element: the most objects per byte
        '{"A": [' + ",".join(["[[0.5]]"] * 20000) + "]}",
        '{"A": [[' + ",".join(["0"] * 40000) + "]]}",
        '{"A": {"dtype": "complex128", "data": [' + ",".join(["[[[0,0]]]"] * 10000) + "]}}",
        '{"A": [' + ",".join(['[["NaN"]]'] * 10000) + "]}",
    ],
)
def test_reservation_bounds_adversarial_json(text):
    body = text.encode()
    for _ in range(2):
        peak, reserved = serve_traced("lu_factor", "json", body, None)
    assert peak <= reserved, (text[:40], peak, reserved, peak / len(body))


DEEP = "[" * 300 + "]" * 300


@pytest.mark.parametrize(
    "text",
    [
        '{"A": [' + ",".join([DEEP] * 400) + "]}",  # nested lists: 44 bytes per byte of text, refused after parsing
        '{"A": [[1]], "x": [' + ",".join([DEEP] * 400) + "]}",  # the same in an option
        '{"A": [' + ",".join(["[]"] * 40000) + "]}",
        '{"A": [[1]], "x": [' + ",".join(["{}"] * 40000) + "]}",
        '{"A": [[1]], "x": [' + ",".join(['{"a":' * 200 + "0" + "}" * 200] * 100) + "]}",
        '{"A": [[1]], "x": [' + ",".join(['"a"'] * 40000) + "]}",
        '{"A": [' + ",".join(["[[0]]"] * 20000) + "]}",
        '{"A": [[' + ",".join(["0.5"] * 40000) + "]]}",
    ],
)
def test_parsing_json_stays_within_what_is_reserved_before_it(text):
    """What the pipeline reserves before parsing (the admission's per-byte factor from Content-Length, then
    the text's lists, objects and strings) bounds the parse, whether or not the body is refused after it:
    a refused body has no answer reserved (the 24x factor alone let nested lists take 44x)."""
    body = bytearray(text.encode())
    extra = json_structure_bytes(body)
    reserved = body_bytes("json", len(body)) + (extra if extra > JSON_SLACK else 0)
    for _ in range(2):
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            with contextlib.suppress(ServiceError):
                decode_native_json(body, ("A",), LIMIT)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    assert peak + len(body) <= reserved, (text[:30], peak / len(body), reserved / len(body))


@pytest.mark.parametrize(
    ("shape", "count"),
    [
        ((), 1),
        ((8, 8), 64),
        ((0, 8), 8),
        ((3, 0, 0), 3),
        ((0,), 1),
        ((2**40, 2**40), 2**80),
        (np.zeros((4, 0, 5)).shape, 20),
    ],
)
def test_work_elements_counts_a_zero_size_dimension_as_one(shape, count):
    """The budget's count: the elements, a zero-size dimension counting as one (an empty tensor's batch still
    sizes its pivots and info), without overflow however large the declared shape."""
    assert work_elements(shape) == count and work_elements(list(shape)) == count
