"""The wire codec: JSON tensors and the Open Inference Protocol's binary framing.

One module serves the native routes and the ``/v2`` routes, so each format is
written once. Decoding is pure (bytes in, NumPy arrays out) and raises
:class:`~service.errors.ServiceError` for anything malformed:

* 400 for bodies that cannot be read as the format (bad JSON, ragged lists,
  a declared shape that disagrees with its data or its byte count);
* 413 when the declared shapes add up to more than ``max_elements``;
* 422 for a dtype name outside the supported list.

Binary tensors are ``np.frombuffer`` views over the received bytes: nothing is
copied while decoding, and nothing is ever unpickled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import orjson

from service.errors import bad_request, brief, invalid, too_large
from service.footprint import work_elements

__all__ = [
    "DATATYPES",
    "HEADER_LENGTH",
    "Decoded",
    "ElementBudget",
    "EncodedBody",
    "check_outputs_known",
    "datatype_of",
    "decode_binary",
    "decode_native_json",
    "decode_v2_json",
    "encode_binary",
    "encode_native_json",
    "encode_v2",
    "little_endian_bytes",
    "oip_dtype",
    "tensor_shape",
]

HEADER_LENGTH = "inference-header-content-length"

# OIP datatype -> little-endian NumPy dtype. COMPLEX64/128 are our extension
# (interleaved re, im); the integer and FP16/BOOL entries exist so that a
# client sending them gets lu_core's clear dtype error rather than a 400.
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(code)
    for name, code in {
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
        "COMPLEX64": "<c8",
        "COMPLEX128": "<c16",
        "INT8": "i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "UINT8": "u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "BOOL": "?",
    }.items()
}
_DATATYPE_OF = {dt.newbyteorder("="): name for name, dt in DATATYPES.items()}
# dtype names accepted in the JSON object form (the contract's list).
JSON_DTYPES = ("float32", "float64", "complex64", "complex128", "int32", "int64")
# Most dimensions of a tensor (NumPy 1's limit; NumPy 2 allows 64, which orjson cannot write back).
MAX_RANK = 32
_NONFINITE_IN = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY


@dataclass
class Decoded:
    """A request, whatever its format: tensors by name and options by name."""

    tensors: dict[str, np.ndarray]
    options: dict[str, Any]
    binary: bool = False
    request_id: str | None = None  # the OIP "id", echoed in /v2 responses
    # /v2 only: the outputs asked for (None: all) and which of them go binary.
    outputs: list[str] | None = None
    binary_outputs: dict[str, bool] = field(default_factory=dict)


@dataclass
class EncodedBody:
    """A response body as chunks (sent without joining) and its headers."""

    chunks: list[bytes | memoryview]
    media_type: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return sum(len(c) if isinstance(c, bytes) else c.nbytes for c in self.chunks)


# --------------------------------------------------------------------------- decoding


def _loads(body: bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "infinity when parsed" in str(exc):  # 1e400: valid JSON, past float64 (orjson refuses it)
            raise bad_request(
                "malformed_json", f'{what} holds a number past float64\'s range ({exc}); send "Infinity" for one'
            ) from None
        raise bad_request("malformed_json", f"{what} is not valid JSON: {exc}") from None


def _numbers(name: str, value: Any) -> np.ndarray:
    """A nested list of JSON numbers (and the non-finite strings) as an array.

    A string never reaches ``np.array``: NumPy would make a text array as wide as the longest string for
    every element (a 60 kB body holding 20,000 zeros and one 20,000-character string asked 1.6 GB; gzipped,
    121 bytes). Lists of numbers only, the common case, are checked in C first (:func:`_numbers_only`);
    anything else is searched for strings, and where there are some walked in Python (:func:`_replace_nonfinite`),
    which turns the non-finite spellings into floats and refuses any other string, or a value that is not a
    number, by name."""
    if not _numbers_only(value):
        try:  # (a copy only where there are strings to replace: nesting alone is np.array's to refuse)
            if _any_string(value):
                value = _replace_nonfinite(name, value)
        except RecursionError:
            raise bad_request("malformed_tensor", f"{name}: nested too deep") from None
    try:
        arr = np.array(value)
    except (ValueError, TypeError, OverflowError, RecursionError):
        raise bad_request(
            "malformed_tensor", f"{name}: nested lists are ragged, too deep or hold non-numbers"
        ) from None
    if arr.ndim > MAX_RANK:
        raise bad_request("malformed_tensor", f"{name}: nested {arr.ndim} deep, at most {MAX_RANK} levels are allowed")
    if arr.dtype.kind not in "iuf":
        what = "booleans" if arr.dtype.kind == "b" else "values that are not numbers (or integers beyond 64 bits)"
        raise bad_request("malformed_tensor", f"{name}: holds {what}")
    return arr


def _numbers_only(value: list) -> bool:
    """Whether the innermost lists of ``value`` (at the depth of its first element's, up to ``MAX_RANK``) hold
    numbers only, by summing them in C: a string, a null, an object or a list deeper than the first element's
    stops the sum with a ``TypeError`` (booleans sum: ``np.array`` then reads them as NumPy does). Each level
    above is flattened only where it holds lists alone (a string there would be taken apart character by
    character). About a fifth of ``np.array``'s own time on a 300 x 300 matrix."""
    if type(value) is not list:  # a scalar (or anything else): the careful path
        return False
    parents = [value]
    for _ in range(MAX_RANK):
        first = parents[0]
        if not first or type(first[0]) is not list:
            break
        children = list(chain.from_iterable(parents))
        if set(map(type, children)) != {list}:
            return False
        parents = children
    try:
        sum(map(sum, parents))
    except TypeError:
        return False
    return True


def _any_string(value: Any) -> bool:
    return any(map(_any_string, value)) if type(value) is list else isinstance(value, str)


def _replace_nonfinite(name: str, value: Any) -> Any:
    if isinstance(value, list):
        return [_replace_nonfinite(name, v) for v in value]
    if isinstance(value, str):
        try:
            return _NONFINITE_IN[value]
        except KeyError:
            raise bad_request(
                "malformed_tensor",
                f'{name}: string {value[:40]!r} is not a number ("NaN", "Infinity", "-Infinity" are)',
            ) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request("malformed_tensor", f"{name}: holds a value that is not a number")
    return value


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if type(shape) is list and len(shape) <= MAX_RANK:  # the common case in one pass (JSON gives exact ints)
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return tuple(shape)
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise bad_request(
            "malformed_tensor", f"{name}: shape must be a list of non-negative integers, got {brief(shape)}"
        )
    if len(shape) > MAX_RANK:
        raise bad_request(
            "malformed_tensor", f"{name}: shape has {len(shape)} dimensions, at most {MAX_RANK} are supported"
        )
    return tuple(shape)


class _Budget:
    """Counts declared elements across a request, before anything is allocated.

    A zero-size dimension counts as one (:func:`~service.footprint.work_elements`):
    an empty tensor's batch dimensions still size its pivots, ``info`` and bookkeeping.
    """

    def __init__(self, max_elements: int) -> None:
        self.left = max_elements
        self.max = max_elements

    def take(self, name: str, count: int) -> None:
        self.left -= count
        if self.left < 0:
            raise too_large(
                "too_many_elements",
                f"{name}: the request's tensors hold more than LU_MAX_ELEMENTS = {self.max} elements",
            )


def _typed_tensor(
    name: str, dtype: np.dtype, shape: tuple[int, ...] | None, data: Any, budget: _Budget, nesting: bool = False
) -> np.ndarray:
    """``data`` (flat or nested, complex as [re, im]) as ``dtype``, checked against ``shape``: its element
    count, and with ``nesting`` (the native form) the nesting of nested data too, up to dimensions of
    one. The OIP forms count elements only, as Triton does (its parser walks nested data in row-major
    order whatever the nesting)."""
    if dtype.kind == "b":  # refused as a binary or gRPC BOOL tensor is (by lu_core), before reading its data
        raise invalid("invalid_dtype", f"{name}: unsupported datatype BOOL; send a floating, complex or integer type")
    count = math.prod(shape) if shape is not None else None
    if shape is not None:
        budget.take(name, work_elements(shape))
    arr = _numbers(name, data) if isinstance(data, list) else _numbers(name, [data])
    if not isinstance(data, list):
        arr = arr.reshape(())
    if dtype.kind == "c" and arr.size == 0:
        arr = np.zeros(0, np.complex128)
    elif dtype.kind == "c":
        if arr.ndim == 0 or arr.shape[-1] != 2:
            raise bad_request("malformed_tensor", f"{name}: complex elements must be [re, im] pairs")
        arr = np.ascontiguousarray(arr, dtype=np.float64).view(np.complex128)[..., 0]
    elif dtype.kind in "iu" and arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise bad_request("malformed_tensor", f"{name}: dtype {dtype.name} needs integer data")
    if dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            raise bad_request("malformed_tensor", f"{name}: a value is out of range for {dtype.name}")
    if count is None:
        budget.take(name, work_elements(arr.shape))
        shape = arr.shape
    elif arr.size != count:
        raise bad_request(
            "shape_mismatch", f"{name}: declared shape {list(shape)} holds {count} elements, data holds {arr.size}"
        )
    elif nesting and arr.ndim > 1 and arr.size and _squeezed(arr.shape) != _squeezed(shape):
        # Nested data: its nesting is a shape too, and must be the one declared (up to dimensions of one).
        raise bad_request(
            "shape_mismatch",
            f"{name}: declared shape {list(shape)}, data nested as {list(arr.shape)} "
            "(send it flat, or nested as declared)",
        )
    # A float64 value past float32's (or float16's) range becomes +-inf, as a non-finite value sent as
    # such would: allowed input, so no RuntimeWarning for it in the log.
    with np.errstate(over="ignore"):
        return arr.astype(dtype.newbyteorder("="), copy=False).reshape(shape)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _json_tensor(name: str, value: Any, default: np.dtype, budget: _Budget) -> np.ndarray:
    """A tensor in the native JSON form: nested list, or {"dtype", "shape", "data"}."""
    if isinstance(value, list | str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        # (a bare string: one of the non-finite spellings, "Infinity" for a scalar like anorm, or a 400)
        arr = _numbers(name, value)
        budget.take(name, work_elements(arr.shape))
        if default.kind == "f" and arr.dtype.kind in "iu":
            return arr.astype(default)
        return arr.astype(np.int64) if arr.dtype.kind in "iu" else arr
    if isinstance(value, dict):
        unknown = set(value) - {"dtype", "shape", "data"}
        if unknown:
            raise bad_request(
                "malformed_tensor", f"{name}: unknown keys {brief(sorted(unknown))} (expected dtype, shape, data)"
            )
        if "data" not in value:
            raise bad_request("malformed_tensor", f"{name}: the object form needs 'data'")
        dtype_name = value.get("dtype", default.name)
        if not isinstance(dtype_name, str) or dtype_name not in JSON_DTYPES:
            raise invalid("invalid_dtype", f"{name}: dtype {brief(dtype_name)} is not one of {', '.join(JSON_DTYPES)}")
        shape = _shape(name, value["shape"]) if "shape" in value else None
        return _typed_tensor(name, np.dtype(dtype_name), shape, value["data"], budget, nesting=True)
    raise bad_request("malformed_tensor", f"{name}: expected a nested list or a {{dtype, shape, data}} object")


def _default_dtype(name: str) -> np.dtype:
    return np.dtype(np.int32) if name == "pivots" else np.dtype(np.float64)


def decode_native_json(body: bytes | bytearray | memoryview, tensor_names: Iterable[str], max_elements: int) -> Decoded:
    """``{"A": ..., "B": ..., "left": true}``: tensors by name, the other keys are options."""
    obj = _loads(body, "the body")
    if not isinstance(obj, dict):
        raise bad_request("malformed_body", "the body must be a JSON object")
    names = set(tensor_names)
    budget = _Budget(max_elements)
    tensors = {k: _json_tensor(k, v, _default_dtype(k), budget) for k, v in obj.items() if k in names}
    options = {k: v for k, v in obj.items() if k not in names}
    return Decoded(tensors, options)


def _oip_dtype(name: str, datatype: Any) -> np.dtype:
    if not isinstance(datatype, str):
        raise bad_request("malformed_tensor", f"{name}: datatype must be a string")
    try:
        return DATATYPES[datatype]
    except KeyError:
        raise invalid(
            "invalid_dtype",
            f"{name}: datatype {brief(datatype)} is unknown; the operations take FP32, FP64, COMPLEX64 or COMPLEX128 "
            "matrices and INT32 or INT64 pivots",
        ) from None


def _oip_inputs(header: Any) -> list[dict[str, Any]]:
    if not isinstance(header, dict):
        raise bad_request("malformed_body", "the inference request must be a JSON object")
    inputs = header.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(i, dict) for i in inputs):
        raise bad_request("malformed_body", "'inputs' must be a list of tensor objects")
    return inputs


def _oip_common(header: dict[str, Any], tensors: dict[str, np.ndarray], binary: bool) -> Decoded:
    options = header.get("parameters", {})
    if not isinstance(options, dict):
        raise bad_request("malformed_body", "'parameters' must be an object")
    rid = header.get("id")
    if rid is not None and not isinstance(rid, str):
        raise bad_request("malformed_body", "'id' must be a string")
    outputs = header.get("outputs")
    names: list[str] | None = None
    flags: dict[str, bool] = {}
    if outputs is not None:
        if not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
        ):
            raise bad_request("malformed_body", "'outputs' must be a list of objects with a 'name'")
        names = [o["name"] for o in outputs]
        for o in outputs:
            params = o.get("parameters") or {}
            if not isinstance(params, dict):
                raise bad_request("malformed_body", f"outputs[{brief(o['name'])}].parameters must be an object")
            flag = params.get("binary_data")
            if flag is not None:
                if not isinstance(flag, bool):
                    raise bad_request(
                        "malformed_body", f"outputs[{brief(o['name'])}].parameters.binary_data must be a boolean"
                    )
                flags[o["name"]] = flag
    default_binary = options.get("binary_data_output", binary)
    if not isinstance(default_binary, bool):
        raise bad_request("malformed_body", "parameters.binary_data_output must be a boolean")
    opts = {k: v for k, v in options.items() if k != "binary_data_output"}
    decoded = Decoded(tensors, opts, binary=binary, request_id=rid, outputs=names, binary_outputs=flags)
    decoded.binary_outputs.setdefault("*", default_binary)
    return decoded


def _tensor_name(entry: dict[str, Any], seen: dict[str, np.ndarray]) -> str:
    name = entry.get("name")
    if not isinstance(name, str):
        raise bad_request("malformed_tensor", "every input needs a string 'name'")
    if name in seen:
        raise bad_request("malformed_tensor", f"input {brief(name)} appears twice")
    return name


def decode_v2_json(body: bytes | bytearray | memoryview, max_elements: int) -> Decoded:
    """An OIP v2 JSON inference request (every tensor inline in ``data``)."""
    header = _loads(body, "the body")
    budget = _Budget(max_elements)
    tensors: dict[str, np.ndarray] = {}
    for entry in _oip_inputs(header):
        name = _tensor_name(entry, tensors)
        if "data" not in entry:
            raise bad_request("malformed_tensor", f"{name}: a JSON request carries each tensor in 'data'")
        dtype = _oip_dtype(name, entry.get("datatype"))
        tensors[name] = _typed_tensor(name, dtype, _shape(name, entry.get("shape")), entry["data"], budget)
    return _oip_common(header, tensors, binary=False)


def decode_binary(body: bytes | bytearray | memoryview, header_length: str | int, max_elements: int) -> Decoded:
    """The binary tensor extension: a JSON header, then each input's raw bytes in order."""
    try:
        hlen = int(header_length)
    except (TypeError, ValueError):
        raise bad_request("malformed_header", "Inference-Header-Content-Length must be an integer") from None
    if not 0 < hlen <= len(body):
        raise bad_request(
            "malformed_header", f"Inference-Header-Content-Length = {hlen} is outside the body of {len(body)} bytes"
        )
    view = memoryview(body)
    header = _loads(view[:hlen], "the inference header")
    budget = _Budget(max_elements)
    tensors: dict[str, np.ndarray] = {}
    offset = hlen
    for entry in _oip_inputs(header):
        name = _tensor_name(entry, tensors)
        dtype = _oip_dtype(name, entry.get("datatype"))
        shape = _shape(name, entry.get("shape"))
        params = entry.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is None:
            if "data" not in entry:
                raise bad_request("malformed_tensor", f"{name}: neither binary_data_size nor data")
            tensors[name] = _typed_tensor(name, dtype, shape, entry["data"], budget)
            continue
        budget.take(name, work_elements(shape))
        count = math.prod(shape)
        if not isinstance(size, int) or isinstance(size, bool) or size != count * dtype.itemsize:
            raise bad_request(
                "shape_mismatch",
                f"{name}: shape {list(shape)} of {entry['datatype']} is {count * dtype.itemsize} bytes, "
                f"binary_data_size says {brief(size)}",
            )
        if offset + size > len(body):
            raise bad_request("truncated_body", f"{name}: the body ends {offset + size - len(body)} bytes early")
        tensors[name] = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += size
    if offset != len(body):
        raise bad_request("malformed_body", f"{len(body) - offset} bytes follow the last tensor")
    return _oip_common(header, tensors, binary=True)


# Shared with the gRPC door (service/grpc_codec.py), which decodes the same tensors from protobuf.
ElementBudget = _Budget
oip_dtype = _oip_dtype
tensor_shape = _shape


# --------------------------------------------------------------------------- encoding


def _plain(arr: np.ndarray, flat: bool) -> Any:
    """What orjson writes for ``arr``: the array itself, or lists with the non-finite strings."""
    complex_ = arr.dtype.kind == "c"
    if complex_:
        arr = np.stack((arr.real, arr.imag), axis=-1)
        if flat:
            arr = arr.reshape(-1, 2)
    elif flat:
        arr = arr.reshape(-1)
    arr = np.asarray(arr, dtype=arr.dtype.newbyteorder("="), order="C")  # (ascontiguousarray makes 0-d 1-d)
    if arr.ndim == 0:
        value = arr.item()
        if isinstance(value, float) and not math.isfinite(value):
            return _SPELLED[0 if value != value else 1 if value > 0 else 2]
        return value
    if complex_ or (arr.dtype.kind == "f" and not np.isfinite(arr).all()):
        return orjson.Fragment(_array_json(arr))
    return arr


# The non-finite values as JSON spells them, in the order NaN, +inf, -inf (the decoder's own table).
_SPELLED = tuple(_NONFINITE_IN)
_SPELLINGS = np.array([f'"{s}"'.encode() for s in _SPELLED], dtype=object)

#: Elements orjson writes at once where :func:`_array_json` cuts an array into blocks.
_JSON_BLOCK = 1 << 13


def _array_json(arr: np.ndarray) -> bytes:
    """The JSON text of ``arr`` (float, C-ordered, native, at least one dimension; nested lists), its non-finite
    values spelled out, written by orjson a block of at most ``_JSON_BLOCK`` elements at a time.

    For arrays whose rows are short (complex pairs: 2) or that hold non-finite values. orjson's buffers while it
    writes an array grow with its rows (~190 bytes per row of two: a 96 x 96 complex64 factorization's JSON
    answer peaked at 1.3x its reservation), and the array made Python floats and lists, as non-finite values
    were written before, took ~250 bytes per element (a 1000 x 1000 float32 one with a NaN: 5x; both found
    by a helper's audit)."""
    return b"[" + _array_items(arr) + b"]"


def _array_items(arr: np.ndarray) -> bytes:
    if arr.size <= _JSON_BLOCK or not arr.shape[0]:
        return _block_json(arr)[1:-1]  # (a copy: the bytes orjson returns keep the buffer it grew)
    rows = _JSON_BLOCK // (arr.size // arr.shape[0])
    if not rows:  # one row is larger than a block: each row by itself, an element of the list
        return b",".join([_array_json(row) for row in arr])
    return b",".join([_array_items(arr[i : i + rows]) for i in range(0, arr.shape[0], rows)])


def _block_json(arr: np.ndarray) -> bytes:
    """orjson's text of ``arr``, each non-finite value (which it writes ``null``) replaced by its spelling: at
    once where they are all of one kind (the usual case: a NaN spreads through a factorization), else by
    splitting the text at each ``null``, in the array's order."""
    text = orjson.dumps(arr, option=orjson.OPT_SERIALIZE_NUMPY)
    bad = arr[~np.isfinite(arr)]  # in the order orjson wrote them
    if not bad.size:
        return text
    kinds = np.where(np.isnan(bad), 0, np.where(bad > 0, 1, 2))
    if (kinds == kinds[0]).all():
        return text.replace(b"null", _SPELLINGS[kinds[0]])
    pieces = text.split(b"null")
    del text
    joined: list[bytes] = [b""] * (2 * len(pieces) - 1)
    joined[::2] = pieces
    joined[1::2] = _SPELLINGS[kinds].tolist()
    return b"".join(joined)


def _json_dtype(arr: np.ndarray) -> str:
    return arr.dtype.newbyteorder("=").name


def encode_native_json(outputs: Mapping[str, np.ndarray | None]) -> EncodedBody:
    """Every output in the object form with nested data; absent outputs are null."""
    body = {
        k: None if v is None else {"dtype": _json_dtype(v), "shape": list(v.shape), "data": _plain(v, flat=False)}
        for k, v in outputs.items()
    }
    return EncodedBody([orjson.dumps(body, option=_JSON_OPTS)], "application/json")


def _raw(arr: np.ndarray) -> memoryview:
    flat = np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C").reshape(-1)
    return memoryview(flat.view(np.uint8))


def little_endian_bytes(arr: np.ndarray) -> memoryview:
    """The tensor's raw bytes as the protocol sends them: little-endian, row-major (a view when it is already)."""
    return _raw(arr)


def datatype_of(arr: np.ndarray) -> str:
    return _DATATYPE_OF[arr.dtype.newbyteorder("=")]


def encode_binary(
    outputs: Mapping[str, np.ndarray | None],
    *,
    binary: Mapping[str, bool] | None = None,
    header_fields: Mapping[str, Any] | None = None,
) -> EncodedBody:
    """OIP response form; outputs flagged binary (all by default) follow the header as raw bytes.

    When no output is binary this is a plain JSON OIP response.
    """
    entries: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for name, arr in outputs.items():
        if arr is None:
            continue
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(arr), "shape": list(arr.shape)}
        if binary is None or binary.get(name, binary.get("*", True)):
            raw = _raw(arr)
            entry["parameters"] = {"binary_data_size": raw.nbytes}
            chunks.append(raw)
        else:
            entry["data"] = _plain(arr, flat=True)
        entries.append(entry)
    header = orjson.dumps({**(header_fields or {}), "outputs": entries}, option=_JSON_OPTS)
    if not chunks:
        return EncodedBody([header], "application/json")
    return EncodedBody(
        [header, *chunks], "application/octet-stream", headers={"Inference-Header-Content-Length": str(len(header))}
    )


def encode_v2(
    model: str, request: Decoded, outputs: Mapping[str, np.ndarray | None], version: str = "1"
) -> EncodedBody:
    """The OIP v2 response: outputs asked for (all by default), each binary or JSON as asked."""
    chosen = {k: v for k, v in outputs.items() if request.outputs is None or k in request.outputs}
    fields: dict[str, Any] = {"model_name": model, "model_version": version}
    if request.request_id is not None:
        fields["id"] = request.request_id
    return encode_binary(chosen, binary=request.binary_outputs, header_fields=fields)


def check_outputs_known(request: Decoded, known: Iterable[str]) -> None:
    """A /v2 request naming an output the model does not have is a 400."""
    if request.outputs is None:
        return
    unknown = [o for o in request.outputs if o not in set(known)]
    if unknown:
        raise bad_request("unknown_output", f"unknown outputs {unknown}; this model has {sorted(known)}")
