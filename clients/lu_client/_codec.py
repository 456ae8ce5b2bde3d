"""The client's side of the wire formats (the server's is ``service.codec``).

The tests encode with one and decode with the other in both directions, so the
two cannot drift. Requests are binary by default: the Open Inference Protocol's
binary tensor extension, a JSON header then each tensor's raw little-endian
row-major bytes. Bodies are handed to httpx as a list of chunks with an exact
Content-Length, never joined.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from lu_client._errors import APIResponseValidationError

__all__ = [
    "DATATYPES",
    "Encoded",
    "Outputs",
    "decode_response",
    "encode_binary",
    "encode_json",
    "from_json_tensor",
    "loads",
    "to_numpy",
]

HEADER_LENGTH = "inference-header-content-length"
DATATYPES: dict[str, np.dtype] = {
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "COMPLEX64": np.dtype("<c8"),
    "COMPLEX128": np.dtype("<c16"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}
_NAME_OF = {dt.newbyteorder("="): name for name, dt in DATATYPES.items()}
#: The dtypes a JSON answer may name (NumPy's names of the wire datatypes), and no other: ``np.dtype``
#: of whatever the server says would take "S500000000" (a 1 GB allocation from a 130-byte answer).
_JSON_DTYPES = {dt.name: dt.newbyteorder("=") for dt in DATATYPES.values()}
#: NumPy's limit on an array's dimensions.
MAX_DIMS = 64
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def to_numpy(value: Any, name: str) -> np.ndarray:
    """NumPy arrays as they are; CuPy and PyTorch (any device) copied to the host; else ``__array__``/DLPack."""
    module = type(value).__module__.split(".")[0]
    if isinstance(value, np.ndarray):
        arr = value
    elif module == "cupy":
        arr = value.get()
    elif module == "torch":
        arr = value.detach().cpu().resolve_conj().resolve_neg().numpy()
    elif hasattr(value, "__array__") or not hasattr(value, "__dlpack__"):
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError, RecursionError) as exc:  # ragged or too deeply nested lists, say
            raise ValueError(f"{name}: not an array of numbers ({exc})") from None
    else:
        arr = np.from_dlpack(value)
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{name}: cannot send an array of dtype {arr.dtype} (expected numbers)")
    return arr


class Outputs(dict):  # type: ignore[type-arg]
    """An answer's outputs by name. Indexing asks for an output that must be there: one the answer lacks,
    or holds as null, is an :class:`APIResponseValidationError`, not a ``KeyError``; ``get`` gives ``None``
    for both (the outputs a call may leave out: ``lu_unpack``'s)."""

    def __missing__(self, name: str) -> Any:
        raise _bad(f"it has no output {name!r}")

    def __getitem__(self, name: str) -> np.ndarray:
        value = super().__getitem__(name)
        if value is None:
            raise _bad(f"its output {name!r} is null")
        return value


class Encoded:
    """A request body as chunks, with its headers and total length."""

    def __init__(self, chunks: list[bytes | memoryview], headers: dict[str, str]) -> None:
        self.chunks = chunks
        self.length = sum(c.nbytes if isinstance(c, memoryview) else len(c) for c in chunks)
        self.headers = {**headers, "content-length": str(self.length)}


def _raw(arr: np.ndarray) -> memoryview:
    flat = np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C").reshape(-1)
    return memoryview(flat.view(np.uint8))


def datatype_of(arr: np.ndarray) -> str:
    try:
        return _NAME_OF[arr.dtype.newbyteorder("=")]
    except KeyError:
        raise TypeError(f"dtype {arr.dtype} has no wire datatype") from None


def encode_binary(tensors: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> Encoded:
    inputs = []
    chunks: list[bytes | memoryview] = []
    for name, arr in tensors.items():
        raw = _raw(arr)
        inputs.append(
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": datatype_of(arr),
                "parameters": {"binary_data_size": raw.nbytes},
            }
        )
        chunks.append(raw)
    header = json.dumps({"inputs": inputs, "parameters": dict(parameters)}, separators=(",", ":")).encode()
    return Encoded(
        [header, *chunks],
        {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(header))},
    )


def _plain(arr: np.ndarray) -> Any:
    if arr.dtype.kind == "c":
        arr = np.stack((arr.real, arr.imag), axis=-1)
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        obj = arr.astype(object)
        obj[np.isnan(arr)] = "NaN"
        obj[np.isposinf(arr)] = "Infinity"
        obj[np.isneginf(arr)] = "-Infinity"
        return obj.tolist()
    return arr.tolist()


def encode_json(tensors: Mapping[str, np.ndarray], options: Mapping[str, Any]) -> Encoded:
    for arr in tensors.values():
        datatype_of(arr)  # the same refusal as the binary framing's, for a dtype the server cannot take
    body: dict[str, Any] = {
        name: {"dtype": arr.dtype.newbyteorder("=").name, "shape": list(arr.shape), "data": _plain(arr)}
        for name, arr in tensors.items()
    }
    body.update(options)
    return Encoded(
        [json.dumps(body, separators=(",", ":"), allow_nan=False).encode()], {"content-type": "application/json"}
    )


def _denan(value: Any) -> Any:
    if isinstance(value, list):
        return [_denan(v) for v in value]
    return _NONFINITE.get(value, value) if isinstance(value, str) else value


def _bad(what: str) -> APIResponseValidationError:
    return APIResponseValidationError(f"the server's answer is malformed: {what}")


def _shape(where: str, shape: Any) -> tuple[int, ...]:
    """A declared shape: a list of non-negative integers (JSON's, not booleans), at most ``MAX_DIMS`` of them."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise _bad(f"{where}: shape {_shown(shape)} is not a list of at most {MAX_DIMS} dimensions")
    if not all(type(d) is int and d >= 0 for d in shape):
        raise _bad(f"{where}: shape {_shown(shape)} holds something other than non-negative integers")
    return tuple(shape)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: The Python types a JSON tensor's numbers may have, by the kind of its dtype (a bool is not a number, a
#: float not an integer, ``null`` nothing): NumPy's conversion would take them all, silently.
_JSON_TYPES = {"f": {int, float}, "c": {int, float}, "i": {int}, "u": {int}, "b": {bool}}


def _from_data(where: str, data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A JSON tensor's nested (or flat) ``data`` as an array of ``shape``; complex values come as pairs.

    Read as an array of the parsed objects first (no copy of any string), each checked to be a number
    of the dtype's kind, or a non-finite spelling for a float: ``null``, booleans among floats, ``"1e3"``
    or ``1.7`` for an integer are refused, not converted.
    """
    try:
        objects = np.array(data, dtype=object)
    except (ValueError, RecursionError) as exc:
        raise _bad(f"{where}: data is not an array ({type(exc).__name__})") from None
    count = math.prod(shape)
    if objects.size != count * (2 if dtype.kind == "c" else 1):
        raise _bad(f"{where}: data holds {objects.size} values, not what shape {list(shape)} of {dtype.name} holds")
    allowed = _JSON_TYPES[dtype.kind]
    types = {type(x) for x in objects.flat}
    if str in types and dtype.kind in "fc":
        spelled = {x for x in objects.flat if type(x) is str}
        if not spelled <= _NONFINITE.keys():
            raise _bad(f"{where}: data holds strings other than {sorted(_NONFINITE)}")
        types.discard(str)
        objects = np.array(_denan(objects.tolist()), dtype=object)
    if not types <= allowed:
        others = sorted(t.__name__ for t in types - allowed)
        raise _bad(f"{where}: data holds {', '.join(others)} values, not {dtype.name} numbers")
    try:
        arr = objects.astype(np.float64 if dtype.kind == "c" else dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _bad(f"{where}: data is not {dtype.name} numbers ({type(exc).__name__})") from None
    if dtype.kind == "c":
        out = np.empty(count, dtype)
        pairs = arr.reshape(-1, 2)
        out.real, out.imag = pairs[:, 0], pairs[:, 1]
        return out.reshape(shape)
    return arr.reshape(shape)


def from_json_tensor(obj: Any, where: str = "a tensor") -> np.ndarray:
    """A tensor in the JSON object form ``{"dtype", "shape", "data"}`` (a wire dtype only: the server's
    answer must not choose an object, string or subarray dtype for the client to allocate)."""
    if not isinstance(obj, dict) or not {"dtype", "shape", "data"} <= obj.keys():
        raise _bad(f"{where} is not an object with dtype, shape and data")
    dtype = _JSON_DTYPES.get(obj["dtype"]) if isinstance(obj["dtype"], str) else None
    if dtype is None:
        raise _bad(f"{where}: dtype {_shown(obj['dtype'])} is not one of {sorted(_JSON_DTYPES)}")
    return _from_data(where, obj["data"], dtype, _shape(where, obj["shape"]))


def loads(content: bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return json.loads(bytes(content))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _bad(f"{what} is not JSON ({type(exc).__name__})") from None


def _oip_dtype(where: str, datatype: Any) -> np.dtype:
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise _bad(f"{where}: datatype {_shown(datatype)} is not one of {sorted(DATATYPES)}")
    return dtype


def _oip_outputs(header: Any) -> list[dict[str, Any]]:
    outputs = header.get("outputs") if isinstance(header, dict) else None
    named = isinstance(outputs, list) and all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)
    if not named:
        raise _bad("'outputs' is not a list of objects with a 'name'")
    names = [o["name"] for o in outputs]
    if len(set(names)) != len(names):
        raise _bad(f"an output appears twice in {_shown(names)}")
    return outputs


def decode_response(content: bytes | bytearray | memoryview, headers: Mapping[str, str]) -> Outputs:
    """The outputs of a 200 answer, in either format, by name (``None`` for outputs not computed).

    Everything the server says is checked before it is used: an answer that is not what the
    protocol allows, or whose header disagrees with its bytes, is an :class:`APIResponseValidationError`
    (never wrong numbers, and no allocation larger than the answer's own bytes imply).
    """
    length = headers.get(HEADER_LENGTH)
    if length is None:
        body = loads(content, "the answer")
        if isinstance(body, dict) and "outputs" in body:  # an OIP JSON answer (from /v2)
            out = Outputs()
            for o in _oip_outputs(body):
                name = o["name"]
                dtype, shape = _oip_dtype(name, o.get("datatype")), _shape(name, o.get("shape"))
                out[name] = _from_data(name, o.get("data"), dtype, shape)
            return out
        if not isinstance(body, dict):
            raise _bad(f"the answer is a JSON {type(body).__name__}, not an object of tensors")
        return Outputs((k, None if v is None else from_json_tensor(v, k)) for k, v in body.items())
    size = len(content)
    if not (length.isascii() and length.isdigit() and len(length) <= 18 and 0 < int(length) <= size):
        raise _bad(f"Inference-Header-Content-Length {_shown(length)} is not a byte count within the {size}-byte body")
    hlen = int(length)
    view = memoryview(content)
    header = loads(view[:hlen], "the answer's header")
    out = Outputs()
    offset = hlen
    for o in _oip_outputs(header):
        name = o["name"]
        dtype = _oip_dtype(name, o.get("datatype"))
        shape = _shape(name, o.get("shape"))
        params = o.get("parameters") or {}
        nbytes = params.get("binary_data_size") if isinstance(params, dict) else None
        if nbytes is None:
            out[name] = _from_data(name, o.get("data"), dtype, shape)
            continue
        count = math.prod(shape)
        if type(nbytes) is not int or nbytes != count * dtype.itemsize:
            raise _bad(
                f"{name}: binary_data_size {_shown(nbytes)} is not the {count * dtype.itemsize} bytes of shape "
                f"{list(shape)}"
            )
        if offset + nbytes > size:
            raise _bad(f"{name}: the body ends {offset + nbytes - size} bytes early")
        out[name] = np.frombuffer(content, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += nbytes
    if offset != size:
        raise _bad(f"{size - offset} bytes follow the last output")
    return out
