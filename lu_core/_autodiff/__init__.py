"""Private machinery shared by :mod:`lu_core.vjp` and :mod:`lu_core.jvp`.

``_args`` validates and converts the arguments of a derivative call;
``_linalg`` holds the batched building blocks the formulas are written in
(triangular solves through the backend, permutations, broadcast reductions).
"""
