"""solve_refined against a float64 (complex128) solve, LAPACK dsgesv's fallback rule, and every error path."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

import lu_core
from lu_core._cpu import _tuning
from tests.helpers import DTYPES, random_matrix, well_conditioned

WIDE = {np.dtype(np.float32): np.float64, np.dtype(np.complex64): np.complex128}


def conditioned(rng: np.random.Generator, n: int, cond: float, dtype=np.float64) -> np.ndarray:
    """A = U diag(s) V^T with singular values from 1 down to 1/cond."""
    u, _ = np.linalg.qr(random_matrix(rng, (n, n), dtype))
    v, _ = np.linalg.qr(random_matrix(rng, (n, n), dtype))
    return ((u * np.logspace(0, -np.log10(cond), n)) @ v.conj().T).astype(dtype)


def backward_error(A: np.ndarray, X: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The issue's definition, written out independently, in extended care (float64/complex128)."""
    A, X, B = (np.asarray(v).astype(np.complex128 if np.iscomplexobj(v) else np.float64) for v in (A, X, B))
    r = B - A @ X
    anorm = np.abs(A).sum(axis=-1).max(axis=-1)
    num = np.abs(r).max(axis=-2)
    den = anorm[..., None] * np.abs(X).max(axis=-2) + np.abs(B).max(axis=-2)
    return np.where(num == 0, 0.0, num / den).max(axis=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((1, 1), (1, 1)), ((4, 4), (4, 3)), ((2, 3, 5, 5), (2, 3, 5, 2)), ((2, 60, 60), (2, 60, 1)), ((40, 40), (40, 4))],
)
def test_matches_a_double_precision_solve(rng, dtype, a_shape, b_shape):
    A = well_conditioned(rng, a_shape, dtype)
    B = random_matrix(rng, b_shape, dtype)
    X, iterations, berr = lu_core.solve_refined(A, B)
    assert X.dtype == np.dtype(dtype) and X.shape == b_shape
    assert iterations.dtype == np.int32 and iterations.shape == a_shape[:-2]
    assert berr.dtype == np.float64 and berr.shape == a_shape[:-2]
    assert (iterations >= 0).all()  # well conditioned: never falls back
    wide = WIDE.get(np.dtype(dtype), dtype)
    oracle = np.linalg.solve(A.astype(wide), B.astype(wide))
    eps = np.finfo(np.dtype(dtype)).eps
    n = a_shape[-1]
    assert np.abs(X - oracle).max() <= 100 * n * eps * max(1.0, np.abs(oracle).max())
    # A residual at rounding level depends on the order of its sums: agree to that level.
    np.testing.assert_allclose(berr, backward_error(A, X, B), rtol=1e-6, atol=np.sqrt(n) * eps)
    assert (berr <= 4 * np.sqrt(n) * eps).all()


def test_well_conditioned_converges_and_ill_conditioned_falls_back(rng):
    n = 64
    good, bad = conditioned(rng, n, 1e3), conditioned(rng, n, 1e13)
    b = rng.standard_normal(n)
    X, it, berr = lu_core.solve_refined(good, b)
    assert 0 < it <= 10  # float32's first solve is not enough; a few steps are
    assert np.abs(X - np.linalg.solve(good, b)).max() <= 1e3 * 1e-15 * 50 * np.abs(X).max()
    assert berr <= np.sqrt(n) * np.finfo(np.float64).eps
    X, it, berr = lu_core.solve_refined(bad, b)
    assert it == -1
    np.testing.assert_array_equal(X, lu_core.solve(bad, b))  # the fallback is our double-precision solve
    assert berr < 1e-15
    # Mixed in one batch, each matrix decides for itself.
    X, it, _ = lu_core.solve_refined(np.stack([good, bad, good]), np.stack([b, b, b]))
    assert it[0] > 0 and it[1] == -1 and it[2] == it[0]
    np.testing.assert_array_equal(X[1], lu_core.solve(bad, b))


def test_complex_ill_conditioned_falls_back(rng):
    A = conditioned(rng, 32, 1e13, np.complex128)
    b = random_matrix(rng, (32, 2), np.complex128)
    X, it, _ = lu_core.solve_refined(A, b)
    assert it == -1
    np.testing.assert_array_equal(X, lu_core.solve(A, b))


def test_float32_overflow_falls_back(rng):
    A = well_conditioned(rng, (2, 6, 6), np.float64)
    A[1] *= 1e39  # beyond float32's range: sgetrf cannot see it
    b = rng.standard_normal((2, 6))
    X, it, _ = lu_core.solve_refined(A, b)
    assert it[0] >= 0 and it[1] == -1
    np.testing.assert_allclose(X, np.linalg.solve(A, b[..., None])[..., 0], rtol=1e-12)


def test_max_iter_zero_falls_back_when_one_solve_is_not_enough(rng):
    A = conditioned(rng, 32, 1e3)
    b = rng.standard_normal(32)
    _, it, _ = lu_core.solve_refined(A, b, max_iter=0)
    assert it == -1
    _, it, _ = lu_core.solve_refined(A, b, max_iter=30)
    assert it > 0


def test_broadcasting_vectors_and_right_side(rng):
    A = well_conditioned(rng, (2, 1, 5, 5), np.float64)
    B = rng.standard_normal((3, 5, 2))
    X, it, berr = lu_core.solve_refined(A, B)
    assert X.shape == (2, 3, 5, 2) and it.shape == (2, 3) and berr.shape == (2, 3)
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-12, atol=1e-14)
    v = rng.standard_normal(5)
    X, it, _ = lu_core.solve_refined(A[0, 0], v)
    assert X.shape == (5,) and it.shape == ()
    np.testing.assert_allclose(X, np.linalg.solve(A[0, 0], v), rtol=1e-12)
    Bt = rng.standard_normal((2, 1, 3, 5))
    X, _, _ = lu_core.solve_refined(A, Bt, left=False)
    np.testing.assert_allclose(X @ A, Bt, atol=1e-12)
    X, _, _ = lu_core.solve_refined(A[0, 0], v[None], left=False)  # one row vector: a (1, n) matrix
    np.testing.assert_allclose(X @ A[0, 0], v[None], atol=1e-12)
    with pytest.raises(lu_core.ShapeError, match="^B: .* batch of vectors .* left=False"):  # as torch.linalg.solve
        lu_core.solve_refined(A[0, 0], v, left=False)


@pytest.mark.parametrize(
    ("factor_dtype", "dtype", "exact_first"),
    [
        (None, np.float64, False),
        ("float32", np.complex128, False),
        ("complex64", np.complex128, False),
        ("float64", np.float64, True),
        (np.float64, np.float64, True),
        (None, np.float32, True),
    ],
)
def test_factor_dtypes(rng, factor_dtype, dtype, exact_first):
    A = well_conditioned(rng, (3, 24, 24), dtype)
    B = random_matrix(rng, (3, 24, 1), dtype)
    _, it, berr = lu_core.solve_refined(A, B, factor_dtype=factor_dtype)
    assert (it >= 0).all()
    if exact_first:  # factored in the working precision: at most a step or two
        assert (it <= 2).all()
    assert (berr <= 4 * np.sqrt(24) * np.finfo(np.dtype(dtype)).eps).all()


@pytest.mark.parametrize(
    ("factor_dtype", "match"),
    [
        ("float16", "GPU only"),
        ("tf32", "GPU only"),
        ("bfloat16", "GPU only"),
        (np.float16, "GPU only"),
        ("int8", "unsupported"),
        ("float128", "unsupported"),
        ("nonsense", "unsupported"),
        (3, "expected a dtype"),
        (object(), "expected a dtype"),
        ("complex64", "cannot factor real"),
    ],
)
def test_unsupported_factor_dtype(rng, factor_dtype, match):
    A = well_conditioned(rng, (3, 3), np.float64)
    with pytest.raises(lu_core.FactorDTypeError, match=match) as excinfo:
        lu_core.solve_refined(A, np.ones(3), factor_dtype=factor_dtype)
    assert isinstance(excinfo.value, ValueError) and str(excinfo.value).startswith("factor_dtype:")
    assert excinfo.value.argument == "factor_dtype"


def test_factor_dtype_more_precise_than_the_input_is_refused():
    with pytest.raises(lu_core.FactorDTypeError, match="more precise"):
        lu_core.solve_refined(np.eye(2, dtype=np.float32), np.ones(2, np.float32), factor_dtype="float64")


def test_singular_raises_naming_the_batch_index(rng):
    A = well_conditioned(rng, (2, 3, 4, 4), np.float64)
    A[1, 2] = 0.0
    A[0, 1, :, 0] = 0.0
    with pytest.raises(lu_core.SingularMatrixError) as excinfo:
        lu_core.solve_refined(A, np.ones((2, 3, 4)))
    assert excinfo.value.indices == [(0, 1), (1, 2)]
    assert excinfo.value.function == "solve_refined"


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "x_shape"),
    [
        ((0, 4, 4), (0, 4, 1), (0, 4, 1)),
        ((0, 0), (0, 3), (0, 3)),
        ((3, 3), (3, 0), (3, 0)),
        ((2, 0, 0), (2, 0), (2, 0)),
    ],
)
def test_empty(a_shape, b_shape, x_shape):
    X, it, berr = lu_core.solve_refined(np.ones(a_shape), np.ones(b_shape))
    assert X.shape == x_shape and it.shape == a_shape[:-2] and berr.shape == a_shape[:-2]
    assert (it == 0).all() and (berr == 0).all()


def test_non_finite_input_falls_back_and_propagates(rng):
    A = well_conditioned(rng, (2, 4, 4), np.float64)
    B = np.ones((2, 4, 1))
    B[1, 0, 0] = np.nan
    A2 = A.copy()
    A2[0, 1, 1] = np.inf
    X, it, berr = lu_core.solve_refined(A, B)
    assert it[0] >= 0 and it[1] == -1 and np.isnan(X[1]).all() and np.isnan(berr[1])
    X, it, _ = lu_core.solve_refined(A2, B)
    assert it[0] == -1  # what a double-precision LU makes of an infinite entry, as solve does
    np.testing.assert_array_equal(X[0], lu_core.solve(A2[0], B[0]))


@pytest.mark.parametrize(
    ("A", "B", "kwargs", "error", "argument"),
    [
        (np.ones(3), np.ones(3), {}, lu_core.ShapeError, "A"),
        (np.ones((3, 4)), np.ones(3), {}, lu_core.ShapeError, "A"),
        (np.eye(3), np.ones((4, 1)), {}, lu_core.ShapeError, "B"),
        (np.eye(3), np.ones((1, 4)), {"left": False}, lu_core.ShapeError, "B"),
        (np.ones((2, 3, 3)), np.ones((3, 3, 1)), {}, lu_core.ShapeError, "A, B"),
        (np.eye(3), np.array(1.0), {}, lu_core.ShapeError, "B"),
        (np.eye(3).astype(bool), np.ones(3), {}, lu_core.DTypeError, "A"),
        (np.eye(3), np.array(["a", "b", "c"]), {}, lu_core.DTypeError, "B"),
        (np.eye(3), np.ones(3), {"max_iter": -1}, lu_core.InvalidInputError, "max_iter"),
        (np.eye(3), np.ones(3), {"max_iter": 1.5}, lu_core.InvalidInputError, "max_iter"),
        (np.eye(3), np.ones(3), {"max_iter": 2**31}, lu_core.InvalidInputError, "max_iter"),  # was Numba's TypingError
        (np.eye(3), np.ones(3), {"max_iter": 10**30}, lu_core.InvalidInputError, "max_iter"),
        (np.eye(3), np.ones(3), {"max_iter": True}, lu_core.InvalidInputError, "max_iter"),
        (np.eye(3), np.ones(3), {"max_iter": "3"}, lu_core.InvalidInputError, "max_iter"),
        (np.eye(3), np.ones(3), {"max_iter": 10**5000}, lu_core.InvalidInputError, "max_iter"),  # past repr's digits
    ],
)
def test_bad_arguments(A, B, kwargs, error, argument):
    with pytest.raises(error) as excinfo:
        lu_core.solve_refined(A, B, **kwargs)
    # the very class (max_iter is a number of steps: not a ShapeError, a subclass of InvalidInputError)
    assert type(excinfo.value) is error
    assert excinfo.value.argument == argument and isinstance(excinfo.value, ValueError)


@pytest.mark.parametrize("name", [">f4", "<f4", ">f8", "=f8", ">c8", ">c16"])
def test_a_factor_dtype_named_with_a_byte_order_is_its_precision(name):
    """A dtype string with a byte order (">f4": big-endian float32) names a precision; it was passed on to the
    kernels in that byte order, which Numba could not type (a TypingError after a 3 s compile)."""
    rng = np.random.default_rng(3)
    want = np.dtype(name)
    A = rng.standard_normal((4, 4)) + 4 * np.eye(4)
    B = rng.standard_normal(4)
    if want.kind == "c":
        A, B = A + 0j, B + 0j
    X, it, _ = lu_core.solve_refined(A, B, factor_dtype=name)
    assert it >= 0
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-12)
    ref = lu_core.solve_refined(A, B, factor_dtype=want.newbyteorder("=").name)
    np.testing.assert_array_equal(X, ref[0])


def test_integers_promote_and_inputs_are_not_modified(rng):
    A = np.array([[4, 1], [2, 3]])
    B = np.array([1, 2])
    A0, B0 = A.copy(), B.copy()
    X, it, _ = lu_core.solve_refined(A, B)
    assert X.dtype == np.float64 and it >= 0
    np.testing.assert_allclose(X, np.linalg.solve(A, B), rtol=1e-15)
    np.testing.assert_array_equal(A, A0)
    np.testing.assert_array_equal(B, B0)


@pytest.mark.parametrize("left", [True, False])
def test_unaligned_input_gives_the_same_bits(rng, left):
    """Request bodies are decoded as views at any byte offset; the answer must not depend on it."""
    A = well_conditioned(rng, (3, 6, 6), np.float64)
    B = rng.standard_normal((3, 6, 2) if left else (3, 2, 6))
    buf = bytearray(1 + A.nbytes)
    Au = np.frombuffer(buf, dtype=np.float64, count=A.size, offset=1).reshape(A.shape)
    Au[...] = A
    assert not Au.flags.aligned
    for got, want in zip(lu_core.solve_refined(Au, B, left=left), lu_core.solve_refined(A, B, left=left), strict=True):
        np.testing.assert_array_equal(got, want)


@contextlib.contextmanager
def _twin(kind: str) -> Iterator[None]:
    """Force every kernel call to its serial or its parallel twin."""
    saved = _tuning.PARALLEL_MIN_WORK
    _tuning.PARALLEL_MIN_WORK = 0 if kind == "parallel" else 1 << 62
    try:
        yield
    finally:
        _tuning.PARALLEL_MIN_WORK = saved


def _bits(out: tuple) -> list[bytes]:
    return [np.ascontiguousarray(v).tobytes() + str(np.shape(v)).encode() for v in out]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [5, 16, 32, 33, 300])
def test_alone_equals_inside_a_batch_and_the_twins_agree(rng, dtype, n):
    """Dynamic batching merges requests: a system's X, iterations and backward error must be the same
    bits alone, in a batch of 1 and anywhere in a batch, whichever kernel twin runs. Sizes: the fused
    kernel (vector lanes full and partly padding), LAPACK on the pool, threaded LAPACK."""
    size = 3 if n > 64 else 200
    A = well_conditioned(rng, (size, n, n), dtype)
    B = random_matrix(rng, (size, n, 2), dtype)
    if np.dtype(dtype).itemsize * (2 if np.dtype(dtype).kind == "f" else 1) == 16:
        A[-1] *= 1e39  # overflows float32: this one falls back
    results = {}
    for kind in ("serial", "parallel"):
        with _twin(kind):
            results[kind] = _bits(lu_core.solve_refined(A, B))
    assert results["serial"] == results["parallel"]
    batched = lu_core.solve_refined(A, B)
    if np.abs(A[-1]).max() > 1e30:
        assert batched.iterations[-1] == -1 and (batched.iterations[:-1] >= 0).all()
    for i in sorted({0, size // 2, size - 1}):
        want = _bits(tuple(v[i] for v in batched))
        assert _bits(lu_core.solve_refined(A[i], B[i])) == want, f"system {i} alone differs from the batch"
        one = lu_core.solve_refined(A[i : i + 1], B[i : i + 1])
        assert _bits(tuple(v[0] for v in one)) == want, f"system {i} in a batch of 1 differs"
