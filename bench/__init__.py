# lu_core's thread settings (OpenMP wait policy, OpenBLAS spin time) reach the environment
# before any peer loads its runtime, so every contender runs in the process a user gets
# by importing lu_core first (one contender's idle threads spinning would slow the next).
import lu_core._threads  # noqa: F401
