// Batched LU and LU solve for small matrices: a group of lanes per matrix (in
// shared memory; any m x n that fits there, square ones up to 32) or per
// right-hand side (n <= 32, in registers, moved by warp shuffles). This is where
// a batch of small matrices is cheap: no library call per matrix, no pointer
// arrays.
//
// Compiled with NVRTC through cupy.RawModule after <cupy/complex.cuh> and
// common.cuh; instantiated per dtype T (float, double, complex<float>,
// complex<double>).
//
// Groups: `width` lanes (a power of two, 1 .. 32, chosen by the host from the
// shape: lu_core/_gpu/_tuning.py's getrf_width / getrs_width) serve one matrix or vector, so
// a warp holds 32 / width of them at once: an 8 x 8 matrix takes 8 lanes, not a
// whole warp with 24 idle. Shuffles pass `width`, so each group exchanges
// values among its own lanes; every lane of the warp reaches every shuffle
// (full mask), including the groups left without a matrix at the end of the
// batch, which compute on zeros (factor) or mirror a valid problem (solve) and
// write nothing. The grouping changes no arithmetic: each entry sees the same
// operations in the same order whatever the width, so results never depend on
// it.
//
// Storage: column-major per matrix (a(i, j) at s[b * m * n + j * m + i]), the
// layout of cuSOLVER, cuBLAS, LAPACK and our CPU backend; lane g of a group owns
// rows g, g + width, ....
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

// v of lane src of the caller's group of width lanes.
__device__ __forceinline__ float shfl(float v, int src, int width) {
    return __shfl_sync(LU_CORE_FULL_MASK, v, src, width);
}
__device__ __forceinline__ double shfl(double v, int src, int width) {
    return __shfl_sync(LU_CORE_FULL_MASK, v, src, width);
}
template <typename T>
__device__ __forceinline__ complex<T> shfl(complex<T> v, int src, int width) {
    return complex<T>(shfl(v.real(), src, width), shfl(v.imag(), src, width));
}

// LAPACK's pivot choice across a group, for column k of a matrix of m rows
// whose row r lane r % width of the group owns (column-major in shared memory,
// col[r]). i?amax scans from k keeping the first strictly larger |.|: so a NaN
// diagonal stays the pivot, a NaN below it is never chosen, and ties go to the
// smallest index. Each lane keeps the first largest of its own rows (scanned in
// increasing order, strictly larger wins), then the butterfly takes the
// maximum of (value, -index) over the group's lanes: that same choice, on every
// lane of the group. Every lane of the warp shuffles (no early return for a NaN diagonal).
template <typename T>
__device__ __forceinline__ int group_pivot(const T* col, int g, int width, int k, int m) {
    typedef decltype(abs1(T())) R;
    const R at_k = abs1(col[k]);  // the same address on the group's lanes: a broadcast
    R v = R(-1);
    int idx = m;
    for (int r = k + ((g - k) & (width - 1)); r < m; r += width) {  // this lane's rows from k on
        const R mag = abs1(col[r]);
        if (mag > v) {  // false for NaN
            v = mag;
            idx = r;
        }
    }
    if (at_k != at_k) {  // NaN diagonal: it stays the pivot. Through the butterfly (k wins every tie), so
        v = R(1) / R(0);  // that every read of the column, at_k's included, feeds the shuffles: no lane
        idx = k;          // swaps rows (after its shuffles) before the others have read
    }
    for (int off = width >> 1; off > 0; off >>= 1) {
        const R ov = __shfl_xor_sync(LU_CORE_FULL_MASK, v, off, width);
        const int oi = __shfl_xor_sync(LU_CORE_FULL_MASK, idx, off, width);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    return idx;
}

// LU of nbatch m x n matrices read from src and written to s (column-major),
// with 1-based LAPACK pivots (piv, nbatch x min(m, n)) and info per matrix.
// src holds the matrices consecutively, column-major (src_rowmajor = 0; src may
// be s itself: in place) or row-major (1: a C-ordered input, transposed on the
// way into shared memory, so the caller makes no transposed copy first). Without pivoting the pivots are
// still written (1 .. k, as PyTorch does). Any m and n whose matrix fits in
// shared memory (the host checks ld * n * sizeof(T), ld = m made odd, and picks a
// width whose groups * that fit 48 KiB, or one matrix a warp): small square
// matrices, and rectangular ones of any batch, where the libraries would need a
// call per matrix.
//
// Each round a warp takes the next 32 / width matrices, consecutive in s, and
// copies them with one coalesced sweep to its slice of dynamic shared memory
// (each column-major with leading dimension ld, odd: a column's rows are
// consecutive words for the lanes, and the row swap, lane g reading columns g,
// g + width, ..., strides over the banks instead of hitting one); each group
// factors its own there, and the warp copies them back. The pivot row is read
// by every lane of the group at once (a broadcast), and the row swap is spread
// over the group's lanes by column. Loops are not unrolled: one instantiation
// per dtype compiles in seconds and serves every shape.
// Launch: blockDim.x = 32 * warps, shared memory = warps * groups * ld * n *
// sizeof(T), groups = 32 / width.
template <typename T>
__global__ void small_getrf(const T* src, int src_rowmajor, T* s, int* __restrict__ piv, int* __restrict__ info,
                            long long nbatch, int m, int n, int pivot, int width) {
    extern __shared__ __align__(16) unsigned char small_getrf_shared[];
    const int lane = threadIdx.x & 31;
    const int g = lane & (width - 1);  // this lane's place in its group
    const int groups = 32 / width;     // matrices a warp holds
    const int ld = m | 1;
    const int mn = m * n, slot = ld * n;  // a matrix in s, and its slice of shared memory
    T* const warp_sh = reinterpret_cast<T*>(small_getrf_shared) + (threadIdx.x >> 5) * groups * slot;
    T* const sh = warp_sh + (lane / width) * slot;  // this group's matrix
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    const int kk = m < n ? m : n;
    for (long long b0 = warp * groups; b0 < nbatch; b0 += nwarps * groups) {  // uniform per warp
        const long long b = b0 + lane / width;                                 // this group's matrix
        const bool active = b < nbatch;  // false for the groups past the batch's end: zeros, nothing written
        const long long left = nbatch - b0;
        const int held = (left < groups ? (int)left : groups) * mn;  // entries of the warp's matrices in s
        T* const a = s + b0 * mn;
        const T* const in = src + b0 * mn;
        for (int e = lane; e < groups * mn; e += 32) {  // coalesced: the warp's matrices are consecutive
            const int j = e / mn, q = e - j * mn;
            const int c = src_rowmajor ? q % n : q / m, r = src_rowmajor ? q / n : q - c * m;
            warp_sh[j * slot + c * ld + r] = e < held ? in[e] : T(0);
        }
        __syncwarp();
        int first_zero = 0;
        for (int k = 0; k < kk; ++k) {
            T* col = sh + k * ld;
            int p = k;
            if (pivot) {
                p = group_pivot<T>(col, g, width, k, m);
                if (p != k) {  // uniform per group: its lanes got the same p
                    for (int c = g; c < n; c += width) {
                        const T t = sh[c * ld + k];
                        sh[c * ld + k] = sh[c * ld + p];
                        sh[c * ld + p] = t;
                    }
                }
                __syncwarp();  // the swapped rows, and every lane's reads of the column, before it changes
            }
            if (g == 0 && active) piv[b * kk + k] = p + 1;  // LAPACK's 1-based pivots, out
            const T d = col[k];
            if (d == T(0)) {
                if (first_zero == 0) first_zero = k + 1;
            }
            const int r0 = k + 1 + ((g - k - 1) & (width - 1));  // this lane's first row below the diagonal
            if (d != T(0) && reciprocal_is_safe(d)) {
                const T inv = quotient(T(1), d);
                for (int r = r0; r < m; r += width) col[r] = col[r] * inv;
            } else if (d != T(0)) {  // a subnormal pivot: its reciprocal overflows
                for (int r = r0; r < m; r += width) col[r] = quotient(col[r], d);
            }
            for (int r = r0; r < m; r += width) {
                const T l = col[r];
                for (int c = k + 1; c < n; ++c) {
                    const T u = sh[c * ld + k];  // the pivot row: same address on the group's lanes
                    if (u != T(0)) sh[c * ld + r] -= l * u;
                }
            }
            __syncwarp();
        }
        for (int e = lane; e < held; e += 32) {
            const int j = e / mn, c = (e - j * mn) / m, r = e - j * mn - c * m;
            a[e] = warp_sh[j * slot + c * ld + r];
        }
        if (g == 0 && active) info[b] = first_zero;
        __syncwarp();
    }
}

// small_getrs flags (the host's _launch.SMALL_GETRS_*): which inputs are indexed, and how.
#define LU_CORE_GETRS_LU_INDEX 1   // problem t uses factorization lu_index[t], else t * lu_step
#define LU_CORE_GETRS_B_OFFSET 2   // problem t's block of b starts at b_offset[t], else at t * b_step
#define LU_CORE_GETRS_CONJ 4       // conjugate b on the way in and x on the way out (X A^H = B)
#define LU_CORE_GETRS_CHECKED 8    // piv: the user's 1-based pivots, range-checked here (else 0-based, checked)

// Pivot i of a factorization's pivots p (0-based out): with `checked`, p holds LAPACK's
// 1-based pivots as the user gave them; one outside [1, n] records its flat index
// (factorization f, entry i) in *first_bad (the smallest wins) and is read as i, no
// swap, so no lane ever follows it.
__device__ __forceinline__ int small_pivot(const int* p, int i, int n, int checked, long long f, int g,
                                           unsigned long long* first_bad) {
    if (!checked) return p[i];
    const long long q = (long long)p[i] - 1;  // widened: INT_MIN - 1 does not overflow
    if (q < 0 || q >= n) {
        if (g == 0) atomicMin(first_bad, (unsigned long long)(f * n + i));
        return i;
    }
    return (int)q;
}

// Solve with small factorizations (n <= 32): a group of width >= n lanes per
// right-hand side, lane g holding x[g]. Right-hand side r of problem t is read from
// b through element strides (block start, + r * s_rhs, row i at + i * s_row: a
// broadcast or strided B is read in place, never gathered into a copy first) and
// its solution written to w[t, r, :] (length n, contiguous). Problem t uses
// factorization f (lu_index[t], or t * lu_step: 0 for one LU shared by every
// problem, 1 for one LU each) of s (column-major n x n matrices) and piv, so a
// broadcast LU is read, never copied. trans: 0 solves A x = b, 1 A^T x = b, 2
// A^H x = b. flags: LU_CORE_GETRS_* above. Every factorization a problem uses has
// all its n pivots read, hence checked when `checked`: the host reads *first_bad
// (set to all ones before) and raises, discarding w.
template <typename T>
__global__ void small_getrs(const T* __restrict__ s, const int* __restrict__ piv,
                            const long long* __restrict__ lu_index, long long lu_step, const T* __restrict__ b,
                            const long long* __restrict__ b_offset, long long b_step, long long s_rhs,
                            long long s_row, T* __restrict__ w, long long nprob, int nrhs, int n, int trans,
                            int flags, int width, unsigned long long* __restrict__ first_bad) {
    const int lane = threadIdx.x & 31;
    const int g = lane & (width - 1);
    const int groups = 32 / width;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    const long long nvec = nprob * nrhs;
    const int cj = trans == 2;
    const int conj_io = (flags & LU_CORE_GETRS_CONJ) != 0;
    const int checked = (flags & LU_CORE_GETRS_CHECKED) != 0;
    for (long long v0 = warp * groups; v0 < nvec; v0 += nwarps * groups) {  // uniform per warp
        const long long v = v0 + lane / width;
        const bool active = v < nvec;  // false past the end: the group mirrors vector v0's problem, writes nothing
        const bool mine = active && g < n;
        const long long vv = active ? v : v0;
        const long long t = vv / nrhs;
        const int r = (int)(vv - t * nrhs);
        const long long f = (flags & LU_CORE_GETRS_LU_INDEX) ? lu_index[t] : t * lu_step;
        const T* a = s + f * (long long)n * n;  // a(i, j) = a[j * n + i]
        const int* p = piv + f * n;
        const T* bv = b + ((flags & LU_CORE_GETRS_B_OFFSET) ? b_offset[t] : t * b_step) + r * s_rhs;
        T x = mine ? maybe_conj(bv[g * s_row], conj_io) : T(0);
        if (trans == 0) {
            for (int i = 0; i < n; ++i) {  // x = P^T b: the swaps in order, one shuffle each
                const int q = small_pivot(p, i, n, checked, f, g, first_bad);
                x = shfl(x, g == i ? q : g == q ? i : g, width);
            }
            for (int j = 0; j < n; ++j) {  // L y = x, unit diagonal
                const T xj = shfl(x, j, width);
                if (xj != T(0) && mine && g > j) x -= a[(long long)j * n + g] * xj;
            }
            for (int j = n - 1; j >= 0; --j) {  // U x = y
                if (mine && g == j) x = quotient(x, a[(long long)j * n + j]);
                const T xj = shfl(x, j, width);
                if (xj != T(0) && mine && g < j) x -= a[(long long)j * n + g] * xj;
            }
        } else {
            // LAPACK's order (?trsm with a transposed triangle): each entry is its right-hand side minus
            // the products with the entries before it in the solve's order, ascending, then divided;
            // no zero test (trsm makes none on this side). So the CPU backend's bits.
            for (int j = 0; j < n; ++j) {  // op(U) y = b: lower triangular, lane g subtracting j = 0 .. g - 1
                if (mine && g == j) x = quotient(x, maybe_conj(a[(long long)j * n + j], cj));
                const T xj = shfl(x, j, width);
                if (mine && g > j) x -= maybe_conj(a[(long long)g * n + j], cj) * xj;
            }
            for (int i = n - 2; i >= 0; --i) {  // op(L) z = y: unit upper triangular, z_i after every z_k, k > i
                for (int k = i + 1; k < n; ++k) {  // ascending k: a dot product on lane g = i, n^2 / 2 shuffles
                    const T zk = shfl(x, k, width);
                    if (mine && g == i) x -= maybe_conj(a[(long long)i * n + k], cj) * zk;
                }
            }
            for (int i = n - 1; i >= 0; --i) {  // x = P z: the swaps in reverse, one shuffle each
                const int q = small_pivot(p, i, n, checked, f, g, first_bad);
                x = shfl(x, g == i ? q : g == q ? i : g, width);
            }
        }
        if (mine) w[vv * n + g] = maybe_conj(x, conj_io);
    }
}
