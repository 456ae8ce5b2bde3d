"""The gRPC wire form of an inference: ``ModelInferRequest`` in, ``ModelInferResponse`` out.

Requests become the same :class:`~service.codec.Decoded` objects the HTTP routes
produce, with the same checks (element bound, shapes against byte counts,
datatypes), so that everything after decoding is shared. Tensors arrive either
as ``raw_input_contents`` (one little-endian row-major buffer per input, what
``tritonclient.grpc`` sends; decoded as ``np.frombuffer`` views) or in the typed
``contents`` fields. COMPLEX64/COMPLEX128, this service's extension, travel raw
or as interleaved (re, im) pairs in ``fp32_contents``/``fp64_contents``.
The messages are ``tritonclient.grpc.service_pb2``'s (see the README, gRPC).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from service.codec import (
    Decoded,
    ElementBudget,
    datatype_of,
    little_endian_bytes,
    oip_dtype,
    tensor_shape,
)
from service.errors import bad_request, brief
from service.footprint import work_elements

__all__ = ["decode_infer_request", "encode_infer_response", "parameter_value"]

# Which typed field carries each datatype (FP16 and BYTES have none this service reads).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "COMPLEX64": "fp32_contents",
    "COMPLEX128": "fp64_contents",
}


def parameter_value(param: pb.InferParameter) -> Any:
    """The Python value of an ``InferParameter`` (whichever of its oneof fields is set)."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def _shape(name: str, dims: Any) -> tuple[int, ...]:
    # The HTTP check, on the message's repeated int64 (negative dimensions are refused there).
    return tensor_shape(name, [int(d) for d in dims])


def _typed(entry: pb.ModelInferRequest.InferInputTensor, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    name = entry.name
    field = _CONTENTS.get(entry.datatype)
    if field is None:
        raise bad_request("malformed_tensor", f"{name}: datatype {entry.datatype} has no typed contents; send it raw")
    values = getattr(entry.contents, field)
    count = math.prod(shape) * (2 if dtype.kind == "c" else 1)
    if len(values) != count:
        raise bad_request(
            "shape_mismatch", f"{name}: shape {list(shape)} of {entry.datatype} needs {count} values, got {len(values)}"
        )
    if dtype.kind == "c":
        pairs = np.array(values, dtype=np.float32 if dtype.itemsize == 8 else np.float64)
        return pairs.view(dtype.newbyteorder("=")).reshape(shape)
    if dtype.kind in "iu":
        wide = np.array(values, dtype=np.uint64 if field == "uint64_contents" else np.int64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise bad_request("malformed_tensor", f"{name}: a value is out of range for {entry.datatype}")
        return wide.astype(dtype.newbyteorder("=")).reshape(shape)
    return np.array(values, dtype=dtype.newbyteorder("=")).reshape(shape)


def decode_infer_request(request: pb.ModelInferRequest, max_elements: int) -> Decoded:
    """A ``ModelInferRequest`` as tensors and options (400/413/422 :class:`ServiceError` as over HTTP)."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise bad_request(
            "malformed_body", f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs: send one per input"
        )
    budget = ElementBudget(max_elements)
    tensors: dict[str, np.ndarray] = {}
    for i, entry in enumerate(request.inputs):
        name = entry.name
        if not name:
            raise bad_request("malformed_tensor", "every input needs a name")
        if name in tensors:
            raise bad_request("malformed_tensor", f"input {brief(name)} appears twice")
        dtype = oip_dtype(name, entry.datatype)
        shape = _shape(name, entry.shape)
        count = math.prod(shape)
        budget.take(name, work_elements(shape))  # as over HTTP: a zero-size dimension counts as one
        if not raw:
            tensors[name] = _typed(entry, dtype, shape)
            continue
        if entry.HasField("contents"):
            raise bad_request("malformed_tensor", f"{name}: both contents and raw_input_contents")
        data = raw[i]
        if len(data) != count * dtype.itemsize:
            raise bad_request(
                "shape_mismatch",
                f"{name}: shape {list(shape)} of {entry.datatype} is {count * dtype.itemsize} bytes, "
                f"raw_input_contents[{i}] holds {len(data)}",
            )
        tensors[name] = np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
    options = {key: parameter_value(value) for key, value in request.parameters.items()}
    outputs = [o.name for o in request.outputs] or None
    return Decoded(tensors, options, binary=True, request_id=request.id or None, outputs=outputs)


def encode_infer_response(
    model: str, version: str, request: Decoded, outputs: Mapping[str, np.ndarray | None]
) -> pb.ModelInferResponse:
    """The outputs asked for (all by default), each as raw little-endian bytes."""
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=request.request_id or "")
    for name, arr in outputs.items():
        if arr is None or (request.outputs is not None and name not in request.outputs):
            continue
        response.outputs.add(name=name, datatype=datatype_of(arr), shape=list(arr.shape))
        response.raw_output_contents.append(little_endian_bytes(arr).tobytes())
    return response
