"""What the Open Inference Protocol says about the server and each model, for the REST and gRPC doors.

Every operation is a model. Its tensors are listed with their core shape (``-1``
for each dimension that varies: ``[-1, -1]`` for a matrix, ``[-1]`` for pivots,
``[]`` for a per-matrix scalar); any number of leading batch dimensions may
precede it, which a fixed-length OIP shape cannot say, so the model's
``parameters`` say it. The listed datatype is the default one (what a JSON
list becomes); ``parameters.datatypes`` maps each accepted input datatype to the
datatype of every output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.errors import ServiceError, brief
from service.operations import OPERATIONS, Operation, Option

__all__ = ["EXTENSIONS", "INPUT_DATATYPES", "VERSION", "find_model", "model_metadata", "server_metadata"]

VERSION = "1"
EXTENSIONS = ["binary_tensor_data", "parameters"]
PLATFORM = "lu_core"

# The floating datatypes computed in; integer matrices are promoted to FP64 (SPEC §1).
INPUT_DATATYPES = ("FP32", "FP64", "COMPLEX64", "COMPLEX128", "INT32", "INT64")
_NUMPY = {"FP32": np.float32, "FP64": np.float64, "COMPLEX64": np.complex64, "COMPLEX128": np.complex128}
_OIP = {np.dtype(v): k for k, v in _NUMPY.items()}

# Core rank of each tensor (after its batch dimensions); anything unlisted is a matrix.
_CORE_RANK = {"pivots": 1, "info": 0, "iterations": 0, "backward_error": 0, "rcond": 0, "anorm": 0, "logabsdet": 0}
_CORE_RANK.update({"sign": 0, "det": 0})
_INTEGER = {"pivots", "info", "iterations"}  # always INT32
_REAL = {"rcond", "backward_error", "logabsdet", "anorm"}  # the real counterpart of the input


def find_model(name: str, version: str | None = None) -> Operation:
    """The operation served as model ``name`` (404 ``unknown_model`` for any other name or version)."""
    op = OPERATIONS.get(name)
    if op is None:
        raise ServiceError(404, "unknown_model", f"no model {brief(name)}; the models are {sorted(OPERATIONS)}")
    if version not in (None, "", VERSION):
        raise ServiceError(404, "unknown_model", f"model {brief(name)} has only version {VERSION!r}")
    return op


def _computed_in(datatype: str) -> np.dtype:
    return np.dtype(_NUMPY.get(datatype, np.float64))  # integers: promoted to float64


def output_datatype(name: str, datatype: str) -> str:
    """The datatype of output ``name`` when the floating inputs arrive as ``datatype``."""
    if name in _INTEGER:
        return "INT32"
    if name == "backward_error":  # always float64 (lu_core.solve_refined)
        return "FP64"
    dtype = _computed_in(datatype)
    if name in _REAL:
        dtype = np.dtype(dtype.type(0).real.dtype)
    return _OIP[dtype]


def _tensor(name: str) -> dict[str, Any]:
    default = "INT32" if name in _INTEGER else "FP64"
    return {"name": name, "datatype": default, "shape": [-1] * _CORE_RANK.get(name, 2)}


def model_metadata(op: Operation) -> dict[str, Any]:
    """The model metadata response of ``op`` (REST form; gRPC takes its protocol fields)."""
    parameters: dict[str, Any] = {
        k: {"datatype": v.datatype, "default": v.default}
        if isinstance(v, Option)
        else {"datatype": "BOOL", "default": v}
        for k, v in op.options.items()
    }
    parameters["batch_dimensions"] = "any number of leading batch dimensions precede each listed shape"
    parameters["datatypes"] = {dt: {o: output_datatype(o, dt) for o in op.outputs} for dt in INPUT_DATATYPES}
    if "pivots" in op.inputs:
        parameters["pivots_datatypes"] = ["INT32", "INT64"]
    return {
        "name": op.name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": [_tensor(n) for n in op.inputs],
        "outputs": [_tensor(n) for n in op.outputs],
        "parameters": parameters,
        "description": op.summary
        + " Inputs of mixed floating datatypes compute in NumPy's result type of the two; integers in FP64.",
    }


def server_metadata(version: str, max_request_bytes: int, max_elements: int) -> dict[str, Any]:
    return {
        "name": "lu-service",
        "version": version,
        "extensions": list(EXTENSIONS),
        # Not part of OIP: lets lu_client split batches that would exceed them.
        "limits": {"max_request_bytes": max_request_bytes, "max_elements": max_elements},
    }
