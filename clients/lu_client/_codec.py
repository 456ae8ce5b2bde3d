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

__all__ = ["DATATYPES", "Encoded", "decode_response", "encode_binary", "encode_json", "from_json_tensor", "to_numpy"]

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


def _from_data(data: Any, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    try:
        arr = np.array(data, dtype=np.float64 if dtype.kind == "c" else dtype)
    except (ValueError, TypeError):
        arr = np.array(_denan(data), dtype=np.float64 if dtype.kind == "c" else dtype)
    if dtype.kind == "c":
        out = np.empty(math.prod(shape), dtype)
        pairs = arr.reshape(-1, 2) if arr.size else np.zeros((0, 2))
        out.real, out.imag = pairs[:, 0], pairs[:, 1]
        return out.reshape(shape)
    return arr.reshape(shape)


def from_json_tensor(obj: Mapping[str, Any]) -> np.ndarray:
    """A tensor in the JSON object form ``{"dtype", "shape", "data"}``."""
    return _from_data(obj["data"], np.dtype(obj["dtype"]), obj["shape"])


def decode_response(content: bytes | bytearray, headers: Mapping[str, str]) -> dict[str, np.ndarray | None]:
    """The outputs of a 200 answer, in either format, by name (``None`` for outputs not computed)."""
    length = headers.get(HEADER_LENGTH)
    if length is None:
        body = json.loads(content)
        if "outputs" in body:  # an OIP JSON answer (from /v2)
            return {o["name"]: _from_data(o["data"], DATATYPES[o["datatype"]], o["shape"]) for o in body["outputs"]}
        return {
            k: None if v is None else _from_data(v["data"], np.dtype(v["dtype"]), v["shape"]) for k, v in body.items()
        }
    hlen = int(length)
    header = json.loads(bytes(content[:hlen]))
    out: dict[str, np.ndarray | None] = {}
    offset = hlen
    for o in header["outputs"]:
        dtype = DATATYPES[o["datatype"]]
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[o["name"]] = _from_data(o["data"], dtype, o["shape"])
            continue
        count = math.prod(o["shape"])
        out[o["name"]] = np.frombuffer(content, dtype=dtype, count=count, offset=offset).reshape(o["shape"])
        offset += size
    return out
