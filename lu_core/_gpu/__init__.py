"""GPU backend (CuPy). Imported only when CuPy arrays reach ``lu_core``."""
