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
