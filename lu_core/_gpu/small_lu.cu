// Batched LU and LU solve for small matrices: one warp per matrix (in shared
// memory; any m x n that fits there, square ones up to 32) or per right-hand
// side (n <= 32, in registers, moved by warp shuffles). This is where a batch
// of small matrices is cheap: no library call per matrix, no pointer arrays.
//
// Compiled with NVRTC through cupy.RawModule after <cupy/complex.cuh> and
// common.cuh; instantiated per dtype T (float, double, complex<float>,
// complex<double>).
//
// Storage: column-major per matrix (a(i, j) at s[b * m * n + j * m + i]), the
// layout of cuSOLVER, cuBLAS, LAPACK and our CPU backend; lane i of the warp
// owns rows i, i + 32, ..., so each column load / store is coalesced.
//
// Numerics follow the CPU backend's getrf / getrs kernels (LAPACK's getf2 /
// getrs order): the pivot is the first entry of largest |re| + |im| at or
// below the diagonal (LAPACK's i?amax), an exact zero pivot records info and
// skips the scaling, the multipliers are scaled by the reciprocal of the pivot
// (divided by a subnormal one, whose reciprocal overflows), and in the
// factorization and the untransposed solve an update with an exact zero factor
// is skipped (so 0 * Inf never makes a NaN that LAPACK would not make); the
// transposed solves sum their dot products in trsm's order, without that test,
// as LAPACK does. Every division is common.cuh's quotient(): for complex dtypes
// the CPU backend's (CPython's) algorithm, so complex results round alike too.

#define LU_CORE_FULL_MASK 0xffffffffu

template <typename T>
__device__ __forceinline__ T abs1(T x) {
    return fabs(x);
}
template <typename T>
__device__ __forceinline__ T abs1(complex<T> x) {
    return fabs(x.real()) + fabs(x.imag());
}

__device__ __forceinline__ float shfl(float v, int src) {
    return __shfl_sync(LU_CORE_FULL_MASK, v, src);
}
__device__ __forceinline__ double shfl(double v, int src) {
    return __shfl_sync(LU_CORE_FULL_MASK, v, src);
}
template <typename T>
__device__ __forceinline__ complex<T> shfl(complex<T> v, int src) {
    return complex<T>(shfl(v.real(), src), shfl(v.imag(), src));
}

// LAPACK's pivot choice across the warp, for column k of a matrix of m rows
// whose row r lane r % 32 owns (column-major in shared memory, col[r]).
// i?amax scans from k keeping the first strictly larger |.|: so a NaN
// diagonal stays the pivot, a NaN below it is never chosen, and ties go to the
// smallest index. Each lane keeps the first largest of its own rows (scanned in
// increasing order, strictly larger wins), then the butterfly takes the
// maximum of (value, -index) over the lanes: that same choice, on every lane.
template <typename T>
__device__ __forceinline__ int warp_pivot(const T* col, int lane, int k, int m) {
    typedef decltype(abs1(T())) R;
    const R at_k = abs1(col[k]);  // the same address on every lane: a broadcast
    if (at_k != at_k) return k;   // NaN diagonal: nothing compares greater
    R v = R(-1);
    int idx = m;
    for (int r = k + ((lane - k) & 31); r < m; r += 32) {  // this lane's rows from k on
        const R mag = abs1(col[r]);
        if (mag > v) {  // false for NaN
            v = mag;
            idx = r;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const R ov = __shfl_xor_sync(LU_CORE_FULL_MASK, v, off);
        const int oi = __shfl_xor_sync(LU_CORE_FULL_MASK, idx, off);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    return idx;
}

// LU of nbatch m x n matrices in place in s, with 1-based LAPACK pivots (piv,
// nbatch x min(m, n)) and info per matrix. Without pivoting the pivots are
// still written (1 .. k, as PyTorch does). Any m and n whose matrix fits in a
// warp's slice of shared memory (the host checks: ld * n * sizeof(T), ld = m
// made odd): small square matrices, and rectangular ones of any batch, where
// the libraries would need a call per matrix.
//
// Each warp copies its matrix to its slice of dynamic shared memory
// (column-major, leading dimension ld, odd: a column's rows are consecutive
// words for the lanes, and the row swap, lane c reading column c, strides
// over the banks instead of hitting one), factors it there and copies it back.
// Lane i owns rows i, i + 32, ...;
// the pivot row is read by every lane at once (a broadcast), and the row swap
// is spread over the lanes by column. Loops are not unrolled: one
// instantiation per dtype compiles in seconds and serves every shape.
// Launch: blockDim.x = 32 * warps, shared memory = warps * ld * n * sizeof(T).
template <typename T>
__global__ void small_getrf(T* __restrict__ s, int* __restrict__ piv, int* __restrict__ info, long long nbatch,
                            int m, int n, int pivot) {
    extern __shared__ __align__(16) unsigned char small_getrf_shared[];
    const int lane = threadIdx.x & 31;
    const int ld = m | 1;
    T* sh = reinterpret_cast<T*>(small_getrf_shared) + (long long)(threadIdx.x >> 5) * ld * n;  // this warp's
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    const int kk = m < n ? m : n;
    for (long long b = warp; b < nbatch; b += nwarps) {  // uniform per warp: full-mask shuffles are safe
        T* a = s + b * (long long)m * n;
        for (int c = 0; c < n; ++c) {
            for (int r = lane; r < m; r += 32) sh[c * ld + r] = a[(long long)c * m + r];
        }
        __syncwarp();
        int first_zero = 0;
        for (int k = 0; k < kk; ++k) {
            T* col = sh + k * ld;
            int p = k;
            if (pivot) {
                p = warp_pivot<T>(col, lane, k, m);
                if (p != k) {  // uniform: every lane got the same p
                    for (int c = lane; c < n; c += 32) {
                        const T t = sh[c * ld + k];
                        sh[c * ld + k] = sh[c * ld + p];
                        sh[c * ld + p] = t;
                    }
                }
                __syncwarp();  // the swapped rows, and every lane's reads of the column, before it changes
            }
            if (lane == 0) piv[b * kk + k] = p + 1;  // LAPACK's 1-based pivots, out
            const T d = col[k];
            if (d == T(0)) {
                if (first_zero == 0) first_zero = k + 1;
            }
            const int r0 = k + 1 + ((lane - k - 1) & 31);  // this lane's first row below the diagonal
            if (d != T(0) && reciprocal_is_safe(d)) {
                const T inv = quotient(T(1), d);
                for (int r = r0; r < m; r += 32) col[r] = col[r] * inv;
            } else if (d != T(0)) {  // a subnormal pivot: its reciprocal overflows
                for (int r = r0; r < m; r += 32) col[r] = quotient(col[r], d);
            }
            for (int r = r0; r < m; r += 32) {
                const T l = col[r];
                for (int c = k + 1; c < n; ++c) {
                    const T u = sh[c * ld + k];  // the pivot row: same address on every lane
                    if (u != T(0)) sh[c * ld + r] -= l * u;
                }
            }
            __syncwarp();
        }
        for (int c = 0; c < n; ++c) {
            for (int r = lane; r < m; r += 32) a[(long long)c * m + r] = sh[c * ld + r];
        }
        if (lane == 0) info[b] = first_zero;
        __syncwarp();
    }
}

// Solve with small factorizations (n <= 32), in place on right-hand sides
// w[t, r, :] (length n, contiguous): one warp per right-hand side, lane i
// holding x[i]. Problem t uses factorization lu_index[t] (s: column-major
// n x n matrices, piv0: 0-based pivots), so a broadcast LU is read, never
// copied. trans: 0 solves A x = b, 1 A^T x = b, 2 A^H x = b.
template <typename T>
__global__ void small_getrs(const T* __restrict__ s, const int* __restrict__ piv0,
                            const long long* __restrict__ lu_index, T* __restrict__ w, long long nprob, int nrhs,
                            int n, int trans) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    const long long nvec = nprob * nrhs;
    const bool mine = lane < n;
    const int cj = trans == 2;
    for (long long v = warp; v < nvec; v += nwarps) {  // uniform per warp
        const long long f = lu_index[v / nrhs];
        const T* a = s + f * (long long)n * n;  // a(i, j) = a[j * n + i]
        const int* p = piv0 + f * n;
        T* xv = w + v * n;
        T x = mine ? xv[lane] : T(0);
        if (trans == 0) {
            for (int i = 0; i < n; ++i) {  // x = P^T b: the swaps in order
                const int q = p[i];
                if (q != i) {
                    const T xi = shfl(x, i);
                    const T xq = shfl(x, q);
                    if (lane == i) x = xq;
                    if (lane == q) x = xi;
                }
            }
            for (int j = 0; j < n; ++j) {  // L y = x, unit diagonal
                const T xj = shfl(x, j);
                if (xj != T(0) && mine && lane > j) x -= a[(long long)j * n + lane] * xj;
            }
            for (int j = n - 1; j >= 0; --j) {  // U x = y
                if (lane == j) x = quotient(x, a[(long long)j * n + j]);
                const T xj = shfl(x, j);
                if (xj != T(0) && lane < j) x -= a[(long long)j * n + lane] * xj;
            }
        } else {
            // LAPACK's order (?trsm with a transposed triangle): each entry is its right-hand side minus
            // the products with the entries before it in the solve's order, ascending, then divided;
            // no zero test (trsm makes none on this side). So the CPU backend's bits.
            for (int j = 0; j < n; ++j) {  // op(U) y = b: lower triangular, lane i subtracting j = 0 .. i - 1
                if (lane == j) x = quotient(x, maybe_conj(a[(long long)j * n + j], cj));
                const T xj = shfl(x, j);
                if (mine && lane > j) x -= maybe_conj(a[(long long)lane * n + j], cj) * xj;
            }
            for (int i = n - 2; i >= 0; --i) {  // op(L) z = y: unit upper triangular, z_i after every z_k, k > i
                for (int k = i + 1; k < n; ++k) {  // ascending k: a dot product on lane i, n^2 / 2 shuffles in all
                    const T zk = shfl(x, k);
                    if (lane == i) x -= maybe_conj(a[(long long)i * n + k], cj) * zk;
                }
            }
            for (int i = n - 1; i >= 0; --i) {  // x = P z: the swaps in reverse
                const int q = p[i];
                if (q != i) {
                    const T xi = shfl(x, i);
                    const T xq = shfl(x, q);
                    if (lane == i) x = xq;
                    if (lane == q) x = xi;
                }
            }
        }
        if (mine) xv[lane] = x;
    }
}
