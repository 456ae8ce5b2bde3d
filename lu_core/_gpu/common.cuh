// Device helpers shared by every .cu source of the GPU backend. _sources.py puts
// this file's text after <cupy/complex.cuh> and before each source (NVRTC gets
// one string: no include path is involved).

// Conjugation that is a no-op for real types: one template serves all dtypes.
template <typename T>
__device__ __forceinline__ T maybe_conj(T x, int) {
    return x;
}
template <typename T>
__device__ __forceinline__ complex<T> maybe_conj(complex<T> x, int c) {
    return c ? conj(x) : x;
}

// LAPACK's ?lamch('S'): the smallest normal number, below which 1 / d overflows.
__device__ __forceinline__ float safe_min(float) { return 0x1p-126f; }
__device__ __forceinline__ double safe_min(double) { return 0x1p-1022; }

// Whether ?getf2 scales a column by 1 / d (|d| >= sfmin; the modulus for complex d)
// rather than dividing each entry by d: the CPU backend's rule too.
template <typename T>
__device__ __forceinline__ bool reciprocal_is_safe(T d) {
    return fabs(d) >= safe_min(d);
}
template <typename T>
__device__ __forceinline__ bool reciprocal_is_safe(complex<T> d) {
    return abs(d) >= safe_min(T());
}

// x / d as the CPU backend divides (Numba's complex division is CPython's: through by
// the larger part of d), so that both devices round alike; CuPy's (Thrust's) operator/
// scales by 1 / (|re| + |im|) first, which overflows for a subnormal d. d == 0 gives
// x * Inf (each part Inf or NaN), the CPU backend's rule (a singular U in a solve).
template <typename T>
__device__ __forceinline__ T quotient(T x, T d) {
    return x / d;
}
template <typename T>
__device__ __forceinline__ complex<T> quotient(complex<T> x, complex<T> d) {
    const T xr = x.real(), xi = x.imag(), dr = d.real(), di = d.imag();
    if (dr == T(0) && di == T(0)) {
        const T inf = T(1) / T(0);
        return complex<T>(xr * inf - xi * T(0), xr * T(0) + xi * inf);
    }
    if (fabs(dr) >= fabs(di)) {
        const T ratio = di / dr;
        const T denom = dr + di * ratio;
        return complex<T>((xr + xi * ratio) / denom, (xi - xr * ratio) / denom);
    }
    const T ratio = dr / di;
    const T denom = dr * ratio + di;
    return complex<T>((xr * ratio + xi) / denom, (xi * ratio - xr) / denom);
}
