"""Every error path of every public function: clear errors, named arguments,
nothing modified."""

from __future__ import annotations

import numpy as np
import pytest

import lu_core
from lu_core import DTypeError, PivotError, ShapeError


def _square(n=3, batch=()):
    return np.eye(n) + np.zeros((*batch, n, n))


def test_hierarchy():
    for cls in (ShapeError, DTypeError, PivotError, lu_core.DeviceMismatchError, lu_core.SingularMatrixError):
        assert issubclass(cls, lu_core.LinAlgError)
        assert issubclass(cls, ValueError)


FACTORS = [lu_core.lu_factor, lu_core.lu_factor_ex, lu_core.lu]


@pytest.mark.parametrize("fn", FACTORS)
@pytest.mark.parametrize("A", [np.float64(1.0), np.ones(3), []], ids=["0d", "1d", "empty-list"])
def test_factor_wrong_rank(fn, A):
    with pytest.raises(ShapeError, match="^A: expected a matrix"):
        fn(A)


@pytest.mark.parametrize("fn", FACTORS)
@pytest.mark.parametrize(
    "A",
    [
        np.ones((2, 2), np.float16),
        np.ones((2, 2), bool),
        np.array([["a", "b"], ["c", "d"]]),
        np.array([[1, None], [2, 3]], dtype=object),
        np.ones((2, 2), np.longdouble),
    ],
    ids=["float16", "bool", "str", "object", "longdouble"],
)
def test_factor_unsupported_dtype(fn, A):
    with pytest.raises(DTypeError, match="^A: unsupported dtype"):
        fn(A)


def test_ragged_input():
    with pytest.raises(DTypeError, match="^A: cannot be read as an array"):
        lu_core.lu_factor([[1.0, 2.0], [3.0]])


class TestUnpack:
    def test_wrong_rank(self):
        with pytest.raises(ShapeError, match="^LU: expected a matrix"):
            lu_core.lu_unpack(np.ones(3), np.ones(1, int))
        with pytest.raises(ShapeError, match="^pivots: expected at least one dimension"):
            lu_core.lu_unpack(np.ones((3, 3)), np.int32(1))

    @pytest.mark.parametrize("shape", [(2,), (3, 3), (4,), (1, 3)])
    def test_pivots_shape_mismatch(self, shape):
        with pytest.raises(ShapeError, match=r"^pivots: expected shape \(3,\)"):
            lu_core.lu_unpack(np.ones((3, 3)), np.ones(shape, int))

    def test_rectangular_pivot_shape(self):
        with pytest.raises(ShapeError, match=r"expected shape \(2, 3\)"):
            lu_core.lu_unpack(np.ones((2, 5, 3)), np.ones((2, 5), int))

    @pytest.mark.parametrize("bad", [0, -1, 4, 2**31 - 1])
    def test_pivots_out_of_range(self, bad):
        piv = np.array([[1, 2, 3], [2, bad, 3]], dtype=np.int64)
        saved = piv.copy()
        with pytest.raises(PivotError, match=rf"^pivots: value {bad} at index \(1, 1\) is outside \[1, 3\]"):
            lu_core.lu_unpack(_square(3, (2,)), piv)
        np.testing.assert_array_equal(piv, saved)
        with pytest.raises(PivotError):
            lu_core.lu_unpack(_square(3, (2,)), piv, unpack_pivots=False)

    def test_tall_lu_pivots_may_reach_m(self):
        P, _, _ = lu_core.lu_unpack(np.ones((5, 2)), np.array([5, 4]))
        assert P.shape == (5, 5)

    @pytest.mark.parametrize("dtype", [np.float64, np.float32, bool, np.complex64])
    def test_pivots_dtype(self, dtype):
        with pytest.raises(DTypeError, match="^pivots: pivots must have an integer dtype"):
            lu_core.lu_unpack(_square(), np.ones(3, dtype))

    def test_lu_dtype(self):
        with pytest.raises(DTypeError, match="^LU: unsupported dtype"):
            lu_core.lu_unpack(np.ones((2, 2), np.float16), np.ones(2, int))


class TestLuSolve:
    def setup_method(self):
        self.LU, self.piv = lu_core.lu_factor(_square(3, (2,)))

    def test_non_square(self):
        with pytest.raises(ShapeError, match="^LU: expected square matrices"):
            lu_core.lu_solve(np.ones((3, 4)), np.ones(3, int), np.ones((3, 1)))

    def test_b_rank(self):
        with pytest.raises(ShapeError, match="^B: expected a matrix"):
            lu_core.lu_solve(self.LU, self.piv, np.ones(3))

    @pytest.mark.parametrize(("left", "shape", "what"), [(True, (2, 4, 1), "3 rows"), (False, (2, 1, 4), "3 columns")])
    def test_b_mismatch(self, left, shape, what):
        with pytest.raises(ShapeError, match=f"^B: expected {what}"):
            lu_core.lu_solve(self.LU, self.piv, np.ones(shape), left=left)

    def test_batch_not_broadcastable(self):
        with pytest.raises(ShapeError, match=r"^LU, B: batch dimensions \(2,\) and \(3,\) cannot be broadcast"):
            lu_core.lu_solve(self.LU, self.piv, np.ones((3, 3, 1)))

    def test_pivots_batch_must_match_lu(self):
        with pytest.raises(ShapeError, match="^pivots: expected shape"):
            lu_core.lu_solve(self.LU, self.piv[:1], np.ones((2, 3, 1)))

    @pytest.mark.parametrize("bad", [0, 4, -7])
    def test_pivots_out_of_range(self, bad):
        piv = self.piv.copy()
        piv[1, 2] = bad
        with pytest.raises(PivotError, match=r"index \(1, 2\) is outside \[1, 3\]"):
            lu_core.lu_solve(self.LU, piv, np.ones((2, 3, 1)))

    def test_b_dtype(self):
        with pytest.raises(DTypeError, match="^B: unsupported dtype"):
            lu_core.lu_solve(self.LU, self.piv, np.ones((2, 3, 1), bool))

    def test_nan_and_inf_propagate(self):
        B = np.array([[[np.nan], [1.0], [1.0]], [[np.inf], [1.0], [1.0]]])
        with np.errstate(all="ignore"):
            X = lu_core.lu_solve(self.LU, self.piv, B)
        assert np.isnan(X[0]).any() and not np.isfinite(X[1]).all()


class TestSolve:
    def test_non_square(self):
        with pytest.raises(ShapeError, match="^A: expected square matrices"):
            lu_core.solve(np.ones((2, 3)), np.ones((2, 1)))

    def test_mismatch(self):
        with pytest.raises(ShapeError, match="^B: expected 3 rows"):
            lu_core.solve(_square(3), np.ones((4, 1)))

    def test_b_scalar(self):
        with pytest.raises(ShapeError, match="^B: expected a matrix"):
            lu_core.solve(_square(3), np.float64(1.0))

    def test_broadcast(self):
        with pytest.raises(ShapeError, match="cannot be broadcast"):
            lu_core.solve(_square(3, (2,)), np.ones((3, 3, 1)))


class TestPermutation:
    @pytest.mark.parametrize("m", [-1, 2.5, "3", None, True, 2**31, 2**63, 2**70, np.uint64(2**63)])
    def test_bad_m(self, m):
        with pytest.raises(ShapeError, match="^m: expected a non-negative integer"):
            lu_core.pivots_to_permutation(np.ones(1, int), m)

    def test_too_many_pivots(self):
        with pytest.raises(ShapeError, match="more than m = 2"):
            lu_core.pivots_to_permutation(np.ones(3, int), 2)

    def test_scalar(self):
        with pytest.raises(ShapeError, match="^pivots: expected at least one dimension"):
            lu_core.pivots_to_permutation(np.int32(1), 2)

    def test_out_of_range(self):
        with pytest.raises(PivotError, match="value 3 at index"):
            lu_core.pivots_to_permutation(np.array([3]), 2)

    def test_float(self):
        with pytest.raises(DTypeError):
            lu_core.pivots_to_permutation(np.array([1.0]), 2)


class _FakeCupyArray:
    """Looks like a CuPy array to the dispatcher, without CuPy."""

    __module__ = "cupy._core.core"


def test_mixing_devices_is_an_error():
    with pytest.raises(lu_core.DeviceMismatchError, match="both CuPy"):
        lu_core.lu_solve(_FakeCupyArray(), np.ones(3, int), np.ones((3, 1)))


def _swapped(x):
    """``x`` in the other byte order (big-endian on every machine we run on), same values."""
    x = np.asarray(x)
    return x.astype(x.dtype.newbyteorder("S"))


def _calls():
    rng = np.random.default_rng(11)
    A = rng.standard_normal((2, 4, 4))  # row exchanges in both matrices
    B = rng.standard_normal((2, 4, 3))
    LU, piv = lu_core.lu_factor(A)
    P, L, U = lu_core.lu(A)
    X = lu_core.solve(A, B)
    dA, dB = rng.standard_normal(A.shape), rng.standard_normal(B.shape)
    anorm = np.abs(A).sum(axis=-2).max(axis=-1)
    # (name, function, arguments, which arguments are matrices or vectors of numbers to swap)
    return [
        ("lu_factor", lu_core.lu_factor, (A,), (0,)),
        ("lu_factor_ex", lu_core.lu_factor_ex, (A,), (0,)),
        ("lu", lu_core.lu, (A,), (0,)),
        ("lu_unpack", lu_core.lu_unpack, (LU, piv), (0, 1)),
        ("lu_solve", lu_core.lu_solve, (LU, piv, B), (0, 1, 2)),
        ("solve", lu_core.solve, (A, B), (0, 1)),
        ("det", lu_core.det, (A,), (0,)),
        ("slogdet", lu_core.slogdet, (A,), (0,)),
        ("pivots_to_permutation", lu_core.pivots_to_permutation, (piv, 4), (0,)),
        ("lu_rcond", lu_core.lu_rcond, (LU, piv, anorm), (0, 1, 2)),
        ("solve_refined", lu_core.solve_refined, (A, B), (0, 1)),
        ("jvp.lu_factor", lu_core.jvp.lu_factor, (dA, LU, piv), (0, 1, 2)),
        ("jvp.lu", lu_core.jvp.lu, (dA, P, L, U), (0, 1, 2, 3)),
        ("jvp.lu_solve", lu_core.jvp.lu_solve, (LU, piv, X, dA, dB), (0, 1, 2, 3, 4)),
        ("jvp.solve", lu_core.jvp.solve, (A, X, dA, dB), (0, 1, 2, 3)),
        ("vjp.lu_factor", lu_core.vjp.lu_factor, (LU, piv, dA), (0, 1, 2)),
        ("vjp.lu", lu_core.vjp.lu, (P, L, U, dA, dA), (0, 1, 2, 3, 4)),
        ("vjp.lu_unpack", lu_core.vjp.lu_unpack, (dA, dA, 4, 4), (0, 1)),
        ("vjp.lu_solve", lu_core.vjp.lu_solve, (LU, piv, B, X, dB), (0, 1, 2, 3, 4)),
        ("vjp.solve", lu_core.vjp.solve, (A, B, X, dB), (0, 1, 2, 3)),
    ]


@pytest.mark.parametrize(("name", "fn", "args", "swap"), _calls(), ids=[c[0] for c in _calls()])
def test_big_endian_input_gives_the_native_answer(name, fn, args, swap):
    """Data read from big-endian files (FITS, HDF5, network order) is computed in native order;
    the answer is the native call's, bit for bit, in native order."""
    want = fn(*args)
    got = fn(*(_swapped(a) if i in swap else a for i, a in enumerate(args)))
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert g.dtype == w.dtype and g.dtype.isnative
        assert g.shape == w.shape and g.tobytes() == w.tobytes()


def _leaves(x):
    if isinstance(x, tuple):
        return [leaf for item in x for leaf in _leaves(item)]
    return [np.asarray(x)]


def test_big_endian_input_keeps_the_dtype_rules():
    """Byte order changes nothing else: big-endian integers promote to float64 (pivots of any integer
    type are read), big-endian float16 is refused with the native one's error."""
    A = np.eye(3) * 2 + 1
    np.testing.assert_array_equal(lu_core.lu_factor(A.astype(">i4"))[0], lu_core.lu_factor(A)[0])
    LU, piv = lu_core.lu_factor(A)
    B = np.ones((3, 1))
    for dt in (">i2", ">i8", ">u4"):
        np.testing.assert_array_equal(lu_core.lu_solve(LU, piv.astype(dt), B), lu_core.lu_solve(LU, piv, B))
    with pytest.raises(DTypeError, match="^A: unsupported dtype >f2"):
        lu_core.lu_factor(A.astype(">f2"))
    bad = piv.astype(">i8")
    bad[0] = 4
    with pytest.raises(PivotError, match=r"value 4 at index \(0,\) is outside \[1, 3\]"):
        lu_core.lu_solve(LU, bad, B)


class _Tensor:
    """A stand-in for a PyTorch tensor that requires grad (the real one: test_torch_parity, where PyTorch is
    installed): its __array__ raises RuntimeError until detached, as torch's does."""

    __module__ = "torch"

    def __init__(self, values: np.ndarray, attached: bool = True) -> None:
        self.values, self.attached = values, attached

    def detach(self) -> _Tensor:
        return _Tensor(self.values, attached=False)

    def resolve_conj(self) -> _Tensor:
        return self

    def resolve_neg(self) -> _Tensor:
        return self

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if self.attached:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return self.values


def test_a_torch_tensor_is_detached_before_it_is_read():
    A = np.array([[4.0, 3.0], [6.0, 3.0]])
    LU, piv = lu_core.lu_factor(_Tensor(A))
    np.testing.assert_array_equal(piv, [2, 2])
    np.testing.assert_allclose(LU, [[6.0, 3.0], [2 / 3, 1.0]])
    np.testing.assert_allclose(lu_core.solve(_Tensor(A), _Tensor(np.array([10.0, 12.0]))), [1.0, 2.0])


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: lu_core.lu_factor(np.eye(2), pivot="False"), "pivot"),
        (lambda: lu_core.lu_factor_ex(np.eye(2), check_errors=None), "check_errors"),
        (lambda: lu_core.lu(np.eye(2), pivot=1), "pivot"),
        (lambda: lu_core.lu_unpack(np.eye(2), np.array([1, 2]), unpack_data="yes"), "unpack_data"),
        (lambda: lu_core.lu_unpack(np.eye(2), np.array([1, 2]), unpack_pivots=0), "unpack_pivots"),
        (lambda: lu_core.lu_solve(np.eye(2), np.array([1, 2]), np.ones((2, 1)), left="False"), "left"),
        (lambda: lu_core.lu_solve(np.eye(2), np.array([1, 2]), np.ones((2, 1)), adjoint=None), "adjoint"),
        (lambda: lu_core.lu_solve(np.eye(2), np.array([1, 2]), np.ones((2, 1)), check_errors=[]), "check_errors"),
        (lambda: lu_core.solve(np.eye(2), np.ones(2), left=None), "left"),
        (lambda: lu_core.solve(np.eye(2), np.ones(2), check_errors="no"), "check_errors"),
        (lambda: lu_core.solve_refined(np.eye(2), np.ones(2), left=np.array([True, False])), "left"),
    ],
)
def test_flags_that_are_not_booleans_are_refused_everywhere(call, argument):
    """As PyTorch refuses them (TypeError there): left="False" solved A X = B, left=None X A = B."""
    with pytest.raises(lu_core.InvalidInputError, match=f"^{argument}: expected True or False") as info:
        call()
    assert info.value.argument == argument and isinstance(info.value, ValueError)
    assert lu_core.lu_factor(np.eye(2), pivot=np.True_)[1].tolist() == [1, 2]  # NumPy's booleans are booleans
