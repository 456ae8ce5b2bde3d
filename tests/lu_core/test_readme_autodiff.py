"""The README's examples that wire ``lu_core.vjp.lu_solve`` into ``torch.autograd.Function``
and ``jax.custom_vjp`` run as written, and their gradients equal the framework's own.
Each skips where its framework is not installed (neither is a dependency)."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import lu_core

README = pathlib.Path(__file__).parents[2] / "README.md"


def readme_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"expected one README python block containing {marker!r}, found {len(found)}"
    return found[0]


def random(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


@pytest.mark.parametrize(
    ("dtype", "left", "adjoint"), [(np.complex128, True, True), (np.float32, False, False), (np.complex64, False, True)]
)
def test_torch_autograd_function_example(dtype, left, adjoint):
    torch = pytest.importorskip("torch")
    namespace: dict = {}
    exec(compile(readme_block("class LUSolve(torch.autograd.Function)"), "README.md", "exec"), namespace)
    LUSolve = namespace["LUSolve"]
    rng = np.random.default_rng(7)
    A = (random(rng, (2, 1, 5, 5), dtype) + 5 * np.eye(5)).astype(dtype)
    B = random(rng, (3, 5, 2) if left else (3, 2, 5), dtype)
    LU, piv = torch.linalg.lu_factor(torch.from_numpy(A))

    def grads(solve):
        lu_, b = LU.detach().clone().requires_grad_(), torch.from_numpy(B).requires_grad_()
        (solve(lu_, b).abs() ** 2).sum().backward()
        return lu_.grad, b.grad

    ours = grads(lambda lu_, b: LUSolve.apply(lu_, piv, b, left, adjoint))
    theirs = grads(lambda lu_, b: torch.linalg.lu_solve(lu_, piv, b, left=left, adjoint=adjoint))
    tol = 1e-4 if dtype in (np.float32, np.complex64) else 1e-10
    for o, t in zip(ours, theirs, strict=True):
        torch.testing.assert_close(o, t, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_jax_custom_vjp_example(dtype):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    namespace: dict = {}
    exec(compile(readme_block("@jax.custom_vjp"), "README.md", "exec"), namespace)
    lu_solve = namespace["lu_solve"]
    assert namespace["grad_LU"].shape == (3, 4, 4) and namespace["grad_B"].shape == (4, 2)
    rng = np.random.default_rng(8)
    LU, piv = lu_core.lu_factor((random(rng, (3, 4, 4), dtype) + 4 * np.eye(4)).astype(dtype))
    inverse = np.argsort(lu_core.pivots_to_permutation(piv, 4), axis=-1)
    B = jnp.asarray(random(rng, (4, 2), dtype))

    def plain_jax(lu, b):
        # A = P L U rebuilt from the packed factors with JAX operations: JAX's own derivative.
        LU_ = (jnp.tril(lu, -1) + jnp.eye(4, dtype=lu.dtype)) @ jnp.triu(lu)
        A = jnp.take_along_axis(LU_, jnp.asarray(inverse)[..., None], axis=-2)
        return jnp.linalg.solve(A, jnp.broadcast_to(b, (3, 4, 2)))

    def grads(solve):
        loss = lambda lu, b: jnp.sum(jnp.abs(solve(lu, b)) ** 2)  # noqa: E731
        return jax.grad(loss, argnums=(0, 1))(jnp.asarray(LU), B)

    ours = grads(lambda lu, b: lu_solve(lu, piv, b))
    for o, t in zip(ours, grads(plain_jax), strict=True):
        np.testing.assert_allclose(np.asarray(o), np.asarray(t), rtol=1e-9, atol=1e-10)
