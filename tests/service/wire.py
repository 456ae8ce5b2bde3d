"""A deliberately independent, minimal implementation of the wire formats, for the tests.

The service's codec is checked against this, not against itself.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

OIP = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
    np.dtype(np.complex64): "COMPLEX64",
    np.dtype(np.complex128): "COMPLEX128",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
}
FROM_OIP = {v: k for k, v in OIP.items()}


def binary_request(tensors: dict[str, np.ndarray], parameters: dict[str, Any] | None = None, **extra: Any):
    """(body, headers) in the OIP binary framing."""
    inputs, raw = [], []
    for name, arr in tensors.items():
        arr = np.asarray(arr, order="C")  # (ascontiguousarray would make a 0-d tensor 1-d)
        data = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        inputs.append(
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": OIP[arr.dtype],
                "parameters": {"binary_data_size": len(data)},
            }
        )
        raw.append(data)
    header = json.dumps({"inputs": inputs, "parameters": parameters or {}, **extra}).encode()
    return header + b"".join(raw), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


def parse_binary(content: bytes, header_length: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    header = json.loads(content[:header_length])
    out, offset = {}, header_length
    for o in header["outputs"]:
        dtype = FROM_OIP[o["datatype"]]
        if "parameters" in o and "binary_data_size" in o["parameters"]:
            size = o["parameters"]["binary_data_size"]
            out[o["name"]] = np.frombuffer(content[offset : offset + size], dtype=dtype).reshape(o["shape"])
            offset += size
        else:
            out[o["name"]] = from_flat(o["data"], dtype, o["shape"])
    assert offset == len(content)
    return header, out


def _denan(x: Any) -> Any:
    if isinstance(x, list):
        return [_denan(v) for v in x]
    return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(x, x) if isinstance(x, str) else x


def from_flat(data: list, dtype: np.dtype, shape: list[int]) -> np.ndarray:
    arr = np.array(_denan(data), dtype=np.float64 if dtype.kind == "c" else dtype)
    if dtype.kind == "c":
        out = np.empty(arr.shape[:-1] if arr.size else (0,), dtype)
        if arr.size:  # (re + 1j * im would turn an infinite im into a NaN re)
            out.real, out.imag = arr[..., 0], arr[..., 1]
        arr = out
    return arr.reshape(shape)


def from_json_tensor(obj: dict[str, Any]) -> np.ndarray:
    """The response object form {"dtype", "shape", "data"}."""
    return from_flat(obj["data"], np.dtype(obj["dtype"]), obj["shape"])


def to_json_tensor(arr: np.ndarray) -> dict[str, Any]:
    """The request object form, complex as [re, im], non-finite as strings."""

    def enc(v: Any) -> Any:
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, complex):
            return [enc(v.real), enc(v.imag)]
        if isinstance(v, float) and not np.isfinite(v):
            return "NaN" if np.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": enc(arr.tolist())}
