"""The operations the service exposes, described once for the native and /v2 routes.

Each :class:`Operation` names its input tensors, its options with their
defaults (booleans, or an :class:`Option` with its own check), its outputs,
and the ``lu_core`` call that computes them. Before a
request is queued, :meth:`Operation.prepare` checks the tensors and options
that are present and bounds the size of the answer, so a small request cannot
ask for an enormous result (``lu_unpack`` of a tall matrix, a broadcast solve).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import lu_core
from service.errors import brief, invalid
from service.footprint import work_elements

__all__ = ["OPERATIONS", "Operation", "Option"]

Arrays = Mapping[str, Any]
Outputs = dict[str, Any]


@dataclass(frozen=True)
class Option:
    """A non-boolean option: its default, a check returning the value (or raising a 422), its schemas."""

    default: Any
    check: Callable[[str, Any], Any]
    schema: Mapping[str, Any]
    datatype: str  # as an Open Inference Protocol parameter


def _default(spec: bool | Option) -> Any:
    return spec.default if isinstance(spec, Option) else spec


def option_schema(spec: bool | Option) -> dict[str, Any]:
    """The JSON schema of one option (OpenAPI documents)."""
    if isinstance(spec, Option):
        return {**spec.schema, "default": spec.default}
    return {"type": "boolean", "default": spec}


@dataclass(frozen=True)
class Operation:
    name: str
    summary: str
    inputs: tuple[str, ...]
    options: Mapping[str, bool | Option]
    outputs: tuple[str, ...]
    compute: Callable[[Arrays, Mapping[str, Any]], Outputs]
    output_elements: Callable[[Arrays, Mapping[str, Any]], int]

    def defaults(self) -> dict[str, Any]:
        return {k: _default(v) for k, v in self.options.items()}

    def prepare(self, tensors: Arrays, options: Mapping[str, Any], max_elements: int) -> dict[str, Any]:
        """Check names and option types, bound the output size; return the options with defaults."""
        return self.prepare_counted(tensors, options, max_elements)[0]

    def prepare_counted(
        self, tensors: Arrays, options: Mapping[str, Any], max_elements: int
    ) -> tuple[dict[str, Any], int]:
        """:meth:`prepare`, and the answer's element count (``output_elements``) it bounded."""
        unknown = sorted(set(tensors) - set(self.inputs))
        if unknown:
            raise invalid("unknown_input", f"{self.name} takes inputs {list(self.inputs)}, not {unknown}")
        missing = [n for n in self.inputs if n not in tensors]
        if missing:
            raise invalid("missing_input", f"{self.name} needs input {missing[0]!r}")
        opts = self.defaults()
        for key, value in options.items():
            if key not in self.options:
                raise invalid(
                    "unknown_option",
                    f"{self.name} has no option {brief(key)}; its options are {sorted(self.options)}",
                )
            spec = self.options[key]
            if isinstance(spec, Option):
                opts[key] = spec.check(key, value)
                continue
            if not isinstance(value, bool):
                raise invalid("invalid_option", f"{key}: expected true or false, got {brief(value)}")
            opts[key] = value
        count = self.output_elements(tensors, opts)
        if count > max_elements:
            raise invalid(
                "output_too_large",
                f"{self.name} would return {count} elements, more than LU_MAX_ELEMENTS = {max_elements}",
            )
        return opts, count

    def device_bytes(self, tensors: Arrays, options: Mapping[str, bool], elements: int | None = None) -> int:
        """Device memory the job needs at least, from the shapes: its inputs and outputs
        (``elements``: ``output_elements`` when the caller has it already).

        Outputs are counted in the computing dtype (integer inputs compute in float64);
        workspace is not known in advance and is not counted.
        """
        inputs = sum(int(getattr(t, "nbytes", 0)) for t in tensors.values())
        sizes = [_compute_itemsize(t) for name, t in tensors.items() if name != "pivots"]
        if elements is None:
            elements = self.output_elements(tensors, options)
        return inputs + elements * max(sizes, default=8)


def _compute_itemsize(a: Any) -> int:
    dtype = getattr(a, "dtype", None)
    if dtype is None or dtype.kind not in "fc":
        return 8  # promoted to float64
    return dtype.itemsize


def _dims(a: Any) -> tuple[int, ...]:
    shape = getattr(a, "shape", ())
    if type(shape) is tuple and all(type(d) is int for d in shape):
        return shape  # a NumPy (or CuPy) shape already: no new tuple
    return tuple(int(d) for d in shape)


# Output sizes count each zero-size dimension as one (footprint.work_elements): an empty
# matrix still has its pivots, info and place in the batch, and a batch of 2**29 empty
# systems must not pass for zero work.


def _batch(shape: tuple[int, ...]) -> int:
    return work_elements(shape[:-2]) if len(shape) >= 2 else 1


def _factor_size(t: Arrays, _: Mapping[str, bool]) -> int:
    s = _dims(t["A"])
    if len(s) < 2:
        return 0  # lu_core raises a shape error
    return work_elements(s) + 2 * _batch(s) * max(min(s[-2:]), 1)


def _unpack_size(shape: tuple[int, ...], data: bool, pivots: bool) -> int:
    if len(shape) < 2:
        return 0
    m, n = (max(d, 1) for d in shape[-2:])
    k = min(m, n)
    return _batch(shape) * ((m * k + k * n) * data + m * m * pivots + 1)


def _broadcast_batch(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    if a[:-2] == b[:-2]:
        return work_elements(a[:-2])  # the usual case, without numpy's broadcasting machinery
    try:
        return work_elements(np.broadcast_shapes(a[:-2], b[:-2]))
    except ValueError:
        return 0  # lu_core raises a shape error


def _solve_size(t: Arrays, _: Mapping[str, bool], lhs: str) -> int:
    a, b = _dims(t[lhs]), _dims(t["B"])
    if len(a) < 2 or len(b) < 1:
        return 0
    if len(b) < 2:
        return _batch(a) * max(b[-1], 1)  # a vector, or one per matrix of A's batch
    return _broadcast_batch(a, b) * max(b[-2], 1) * max(b[-1], 1)


def _lu_factor(t: Arrays, o: Mapping[str, bool]) -> Outputs:
    LU, piv, info = lu_core.lu_factor_ex(t["A"], pivot=o["pivot"])
    return {"LU": LU, "pivots": piv, "info": info}


def _lu_unpack(t: Arrays, o: Mapping[str, bool]) -> Outputs:
    P, L, U = lu_core.lu_unpack(t["LU"], t["pivots"], unpack_data=o["unpack_data"], unpack_pivots=o["unpack_pivots"])
    return {"P": P, "L": L, "U": U}


def _lu_solve(t: Arrays, o: Mapping[str, bool]) -> Outputs:
    X = lu_core.lu_solve(
        t["LU"], t["pivots"], t["B"], left=o["left"], adjoint=o["adjoint"], check_errors=o["check_errors"]
    )
    return {"X": X}


def _lu(t: Arrays, o: Mapping[str, bool]) -> Outputs:
    P, L, U = lu_core.lu(t["A"], pivot=o["pivot"])
    return {"P": P, "L": L, "U": U}


def _solve(t: Arrays, o: Mapping[str, bool]) -> Outputs:
    return {"X": lu_core.solve(t["A"], t["B"], left=o["left"], check_errors=o["check_errors"])}


def _solve_refined(t: Arrays, o: Mapping[str, Any]) -> Outputs:
    X, iterations, berr = lu_core.solve_refined(
        t["A"], t["B"], left=o["left"], factor_dtype=o["factor_dtype"], max_iter=o["max_iter"]
    )
    return {"X": X, "iterations": iterations, "backward_error": berr}


def _lu_rcond(t: Arrays, o: Mapping[str, Any]) -> Outputs:
    return {"rcond": lu_core.lu_rcond(t["LU"], t["pivots"], t["anorm"], norm=o["norm"])}


def _slogdet(t: Arrays, _: Mapping[str, Any]) -> Outputs:
    sign, logabsdet = lu_core.slogdet(t["A"])
    return {"sign": sign, "logabsdet": logabsdet}


def _det(t: Arrays, _: Mapping[str, Any]) -> Outputs:
    return {"det": lu_core.det(t["A"])}


def _per_matrix(t: Arrays, name: str, count: int = 1) -> int:
    return count * _batch(_dims(t[name]))


def _refined_size(t: Arrays, o: Mapping[str, Any]) -> int:
    a, b = _dims(t["A"]), _dims(t["B"])
    per_problem = 2 * (_broadcast_batch(a, b) if len(a) >= 2 and len(b) >= 2 else 1)
    return _solve_size(t, o, "A") + per_problem


#: The most refinement steps a request may ask for (LAPACK's default is 30).
MAX_ITER_LIMIT = 1000
#: factor_dtype values the wire accepts; lu_core decides which the device supports.
FACTOR_DTYPES = ("float32", "float64", "complex64", "complex128", "tf32", "float16", "bfloat16")


def _check_max_iter(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ITER_LIMIT:
        raise invalid("invalid_option", f"{key}: expected an integer in [0, {MAX_ITER_LIMIT}], got {brief(value)}")
    return value


def _check_factor_dtype(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid("invalid_option", f"{key}: expected null or one of {list(FACTOR_DTYPES)}, got {brief(value)}")
    if value is not None and value not in FACTOR_DTYPES:
        raise invalid("unsupported_factor_dtype", f"{key}: {brief(value)} is not one of {list(FACTOR_DTYPES)}")
    return value  # lu_core checks the name against the device (tf32, float16, bfloat16: GPU only)


def _check_norm(key: str, value: Any) -> str:
    if value not in ("1", "inf") or not isinstance(value, str):
        raise invalid("invalid_option", f'{key}: expected "1" or "inf", got {brief(value)}')
    return value


_FACTOR_DTYPE = Option(
    None,
    _check_factor_dtype,
    {"anyOf": [{"type": "string", "enum": list(FACTOR_DTYPES)}, {"type": "null"}]},
    "STRING",
)
_MAX_ITER = Option(30, _check_max_iter, {"type": "integer", "minimum": 0, "maximum": MAX_ITER_LIMIT}, "INT64")
_NORM = Option("1", _check_norm, {"type": "string", "enum": ["1", "inf"]}, "STRING")


def _quiet(fn: Callable[[Arrays, Mapping[str, bool]], Outputs]) -> Callable[[Arrays, Mapping[str, bool]], Outputs]:
    """Singular systems answered with check_errors=false hold inf/NaN by design: no warnings."""

    @functools.wraps(fn)  # keeps the name: the device labels its timings with it
    def run(t: Arrays, o: Mapping[str, bool]) -> Outputs:
        with np.errstate(all="ignore"):
            return fn(t, o)

    return run


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "lu_factor",
            "LU factorization with partial pivoting; info reports singular matrices, never an error.",
            ("A",),
            {"pivot": True},
            ("LU", "pivots", "info"),
            _quiet(_lu_factor),
            _factor_size,
        ),
        Operation(
            "lu_unpack",
            "P, L, U from a packed factorization and its 1-based pivots.",
            ("LU", "pivots"),
            {"unpack_data": True, "unpack_pivots": True},
            ("P", "L", "U"),
            _quiet(_lu_unpack),
            lambda t, o: _unpack_size(_dims(t["LU"]), o["unpack_data"], o["unpack_pivots"]),
        ),
        Operation(
            "lu_solve",
            "Solve A X = B (or X A = B) from A's factorization; broadcasts batch dimensions.",
            ("LU", "pivots", "B"),
            {"left": True, "adjoint": False, "check_errors": True},
            ("X",),
            _quiet(_lu_solve),
            lambda t, o: _solve_size(t, o, "LU"),
        ),
        Operation(
            "lu",
            "P, L, U of A in one call.",
            ("A",),
            {"pivot": True},
            ("P", "L", "U"),
            _quiet(_lu),
            lambda t, o: _unpack_size(_dims(t["A"]), True, True),
        ),
        Operation(
            "solve",
            "Factor and solve A X = B (or X A = B) in one call.",
            ("A", "B"),
            {"left": True, "check_errors": True},
            ("X",),
            _quiet(_solve),
            lambda t, o: _solve_size(t, o, "A"),
        ),
        Operation(
            "solve_refined",
            "Solve A X = B with a low-precision LU and iterative refinement (LAPACK dsgesv); "
            "iterations is -1 where a system fell back to a full-precision solve.",
            ("A", "B"),
            {"left": True, "factor_dtype": _FACTOR_DTYPE, "max_iter": _MAX_ITER},
            ("X", "iterations", "backward_error"),
            _quiet(_solve_refined),
            _refined_size,
        ),
        Operation(
            "lu_rcond",
            "Estimate 1 / (||A|| ||A^-1||) from A's factorization (LAPACK ?gecon), in the 1- or inf-norm.",
            ("LU", "pivots", "anorm"),
            {"norm": _NORM},
            ("rcond",),
            _quiet(_lu_rcond),
            lambda t, o: _per_matrix(t, "LU"),
        ),
        Operation(
            "slogdet",
            "Sign and log of the absolute determinant, as torch.linalg.slogdet.",
            ("A",),
            {},
            ("sign", "logabsdet"),
            _quiet(_slogdet),
            lambda t, o: _per_matrix(t, "A", 2),
        ),
        Operation(
            "det",
            "Determinant, as torch.linalg.det.",
            ("A",),
            {},
            ("det",),
            _quiet(_det),
            lambda t, o: _per_matrix(t, "A"),
        ),
    )
}
