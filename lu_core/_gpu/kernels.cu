// CUDA kernels of lu_core's GPU backend.
//
// Compiled at run time with NVRTC through cupy.RawModule (options and
// name_expressions in _sources.py; CuPy's <cupy/complex.cuh> and common.cuh
// come first) and instantiated per dtype (T: float, double, complex<float>,
// complex<double>; I: the pivots' integer type). No type names are pasted into
// this source. Kernels use 64-bit indexing and grid-stride loops so any batch
// size works with any launch shape.
//
// Pivot conventions: pivots arrive 1-based (LAPACK) and are range-checked and
// converted to 0-based by check_pivots, on the device, before the other kernels
// read them (or copied, checked and still 1-based, for cuSOLVER); unpack_direct (and small_lu.cu's small_getrs with its CHECKED flag)
// read the user's 1-based pivots themselves and range-check each before using it.
// No kernel here indexes memory with an unchecked pivot.

// Range check and base conversion in one pass: piv0[t] = piv[t] - 1 + base (base 0: our
// kernels' 0-based pivots; base 1: a checked int32 copy in LAPACK's base, for cuSOLVER).
// An out-of-range pivot records the smallest offending flat index in *first_bad
// (initialised to ULLONG_MAX by the caller) and is replaced by the first row (base),
// so even a caller that ignored the flag, or reads the flag only after a library
// used the copy, could not make a later kernel read out of bounds.
template <typename I>
__global__ void check_pivots(const I* __restrict__ piv, int* __restrict__ piv0, long long total,
                             long long m, int base, unsigned long long* __restrict__ first_bad) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long v = (long long)piv[t];  // unsigned values >= 2^63 wrap negative: caught below
        if (v < 1 || v > m) {
            atomicMin(first_bad, (unsigned long long)t);
            piv0[t] = base;
        } else {
            piv0[t] = (int)(v - 1) + base;
        }
    }
}

// Applies the k pivots of one matrix, in order, to its row order. Sequential
// by nature; the callers parallelise across matrices and around this loop.
__device__ __forceinline__ void apply_pivots(int* order, const int* __restrict__ p, int k) {
    for (int i = 0; i < k; ++i) {
        const int q = p[i];
        const int t = order[i];
        order[i] = order[q];
        order[q] = t;
    }
}

// Small m: one thread per matrix, the row order in registers / local memory.
// The k swaps are sequential by nature; the batch is the parallel dimension.
#define LU_CORE_SMALL_M 32
__global__ void perm_small(const int* __restrict__ piv0, int* __restrict__ perm, long long nbatch,
                           int k, int m) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < nbatch; b += stride) {
        int order[LU_CORE_SMALL_M];
        for (int i = 0; i < m; ++i) order[i] = i;
        apply_pivots(order, piv0 + b * k, k);
        int* out = perm + b * m;
        for (int i = 0; i < m; ++i) out[i] = order[i];
    }
}

// Large m: one block per matrix. The block fills the identity and writes the
// result in parallel; thread 0 applies the k swaps in shared memory, so the
// serial part touches no global memory except the k pivots it reads. Dynamic
// shared memory: m ints (m <= 12288 fits in 48 KiB).
__global__ void perm_shared(const int* __restrict__ piv0, int* __restrict__ perm, long long nbatch,
                            int k, int m) {
    extern __shared__ int order[];
    for (long long b = blockIdx.x; b < nbatch; b += gridDim.x) {
        for (int i = threadIdx.x; i < m; i += blockDim.x) order[i] = i;
        __syncthreads();
        if (threadIdx.x == 0) apply_pivots(order, piv0 + b * k, k);
        __syncthreads();
        int* out = perm + b * m;
        for (int i = threadIdx.x; i < m; i += blockDim.x) out[i] = order[i];
        __syncthreads();
    }
}

// Fallback for m beyond shared memory: same algorithm, swaps in global memory.
__global__ void perm_global(const int* __restrict__ piv0, int* __restrict__ perm, long long nbatch,
                            int k, int m) {
    for (long long b = blockIdx.x; b < nbatch; b += gridDim.x) {
        int* out = perm + b * m;
        for (int i = threadIdx.x; i < m; i += blockDim.x) out[i] = i;
        __syncthreads();
        if (threadIdx.x == 0) apply_pivots(out, piv0 + b * k, k);
        __syncthreads();
    }
}

// The smallest flat index t with x[t] != 0 into *first (initialised to ULLONG_MAX by the caller): for
// a large batch's info, one 8-byte copy tells the host whether any matrix is singular, instead of the
// whole array copied and searched there.
__global__ void first_nonzero(const int* __restrict__ x, long long total, unsigned long long* __restrict__ first) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        if (x[t] != 0) atomicMin(first, (unsigned long long)t);
    }
}

// LAPACK's info read back from packed factorizations (lu_solve's check_errors): 1 + the index of the
// first exact zero on each matrix's diagonal, else 0 (a NaN is not zero). One block per matrix (grid-
// stride over the batch): its threads read the diagonal a block's width at a time and stop after the
// first chunk that holds a zero. Element i of matrix b's diagonal (k of them) is lu[b * s_batch + i *
// s_diag] (element strides: any layout whose batch steps evenly, no copy). Dynamic shared memory: one
// unsigned long long, the smallest zero index found so far.
template <typename T>
__global__ void diagonal_info(const T* __restrict__ lu, int* __restrict__ info, long long nbatch, int k,
                              long long s_batch, long long s_diag) {
    extern __shared__ unsigned long long first_zero[];
    const T zero = T(0);
    const unsigned long long none = (unsigned long long)k;
    for (long long b = blockIdx.x; b < nbatch; b += gridDim.x) {
        if (threadIdx.x == 0) first_zero[0] = none;
        __syncthreads();
        for (int base = 0; base < k; base += blockDim.x) {
            const int i = base + (int)threadIdx.x;
            if (i < k && lu[b * s_batch + (long long)i * s_diag] == zero) {
                atomicMin(first_zero, (unsigned long long)i);
            }
            __syncthreads();
            const bool found = first_zero[0] != none;
            __syncthreads();  // every thread has read it before a later chunk could lower it
            if (found) break;  // the same for every thread of the block
        }
        if (threadIdx.x == 0) info[b] = first_zero[0] != none ? (int)first_zero[0] + 1 : 0;
        __syncthreads();  // thread 0 has read it before the next matrix resets it
    }
}

// Fused unpack: one pass over the packed matrices writes both triangles, and
// P from the row order, each output element exactly once (coalesced: the
// innermost index is contiguous in input and outputs).
//
// src holds nbatch C-contiguous r x c matrices, kk = min(r, c): lower (r x kk)
// gets the part below the diagonal, upper (kk x c) the part above it. The
// diagonal goes to upper with ones on lower's diagonal when unit_lower, the
// other way round otherwise (a column-major LU is split as its transpose, with
// the roles swapped). P (m x m, C-contiguous) gets P[b, perm[b, j], j] = 1.
// I: the index type, int where every index and the grid-stride loop's last step fit in it (the
// launch checks), else long long: a 64-bit division is emulated in tens of instructions, and this
// memory-bound pass does two per element (_launch.unpack picks it).
template <typename T, typename I>
__global__ void unpack(const T* __restrict__ src, T* __restrict__ lower, T* __restrict__ upper,
                       long long nbatch, int r, int c, int unit_lower, const int* __restrict__ perm,
                       T* __restrict__ p_mat, int m, int want_data, int want_p) {
    const int kk = r < c ? r : c;
    const I data_total = want_data ? (I)(nbatch * (long long)r * c) : 0;
    const I p_total = want_p ? (I)(nbatch * (long long)m * m) : 0;
    const I total = data_total + p_total;
    const I stride = (I)gridDim.x * blockDim.x;
    const T one = T(1);
    const T zero = T(0);
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        if (t < data_total) {
            const I per = (I)r * c;
            const I b = t / per;
            const I rem = t - b * per;
            const int i = (int)(rem / c);
            const int j = (int)(rem - (I)i * c);
            const T v = src[t];
            if (j < kk) {
                lower[(b * r + i) * kk + j] = i > j ? v : (i == j ? (unit_lower ? one : v) : zero);
            }
            if (i < kk) {
                upper[(b * kk + i) * c + j] = j > i ? v : (j == i ? (unit_lower ? v : one) : zero);
            }
        } else {
            const I u = t - data_total;
            const I per = (I)m * m;
            const I b = u / per;
            const I rem = u - b * per;
            const int i = (int)(rem / m);
            const int j = (int)(rem - (I)i * m);
            p_mat[u] = perm[b * m + j] == i ? one : zero;
        }
    }
}

// lu_unpack of small factorizations as lu_factor leaves them, in one launch (a block per matrix,
// grid-stride over the batch): the row order from the user's 1-based pivots in shared memory (thread 0
// applies the k swaps; an out-of-range pivot records its flat index in *first_bad by atomicMin, as
// check_pivots does, and is read as no swap, so nothing is indexed with it), then P (m x m, C-ordered),
// L (m x k, unit diagonal) and U (k x n), both column-major as the general path leaves them (each
// written as its C-ordered transpose: read and written along LU's columns), by the block's threads.
// s: each LU's transpose, C-ordered (n x m), i.e. each LU column-major as lu_factor writes it:
// LU[i, j] = s[j * m + i]. piv: (nbatch, k) int32, C-ordered. Dynamic shared memory: m ints.
template <typename T>
__global__ void unpack_direct(const T* __restrict__ s, const int* __restrict__ piv, T* __restrict__ p_mat,
                              T* __restrict__ lower, T* __restrict__ upper, long long nbatch, int m, int n,
                              unsigned long long* __restrict__ first_bad) {
    extern __shared__ int row_of[];
    const int k = m < n ? m : n;
    const T one = T(1);
    const T zero = T(0);
    for (long long b = blockIdx.x; b < nbatch; b += gridDim.x) {
        for (int i = threadIdx.x; i < m; i += blockDim.x) row_of[i] = i;
        __syncthreads();
        if (threadIdx.x == 0) {
            const int* p = piv + b * k;
            for (int i = 0; i < k; ++i) {
                const int v = p[i];
                if (v < 1 || v > m) {
                    atomicMin(first_bad, (unsigned long long)(b * k + i));
                    continue;
                }
                const int t = row_of[i];
                row_of[i] = row_of[v - 1];
                row_of[v - 1] = t;
            }
        }
        __syncthreads();
        const T* lu = s + b * (long long)m * n;
        T* P = p_mat + b * (long long)m * m;
        for (int e = threadIdx.x; e < m * m; e += blockDim.x) {
            const int i = e / m;
            P[e] = row_of[e - i * m] == i ? one : zero;
        }
        T* Lt = lower + b * (long long)m * k;  // L's transpose: Lt[j * m + i] = L[i, j]
        for (int e = threadIdx.x; e < k * m; e += blockDim.x) {
            const int j = e / m;
            const int i = e - j * m;
            Lt[e] = i > j ? lu[e] : (i == j ? one : zero);  // e = j * m + i: LU[i, j]
        }
        T* Ut = upper + b * (long long)k * n;  // U's transpose: Ut[j * k + i] = U[i, j]
        for (int e = threadIdx.x; e < n * k; e += blockDim.x) {
            const int j = e / k;
            const int i = e - j * k;
            Ut[e] = j >= i ? lu[j * m + i] : zero;
        }
        __syncthreads();  // every thread has read row_of before the next matrix resets it
    }
}

// Where each problem's block of an operand starts (element offsets): out[t] =
// sum over the terms of ((t / inner) % size) * stride, for up to four terms
// (lu_core/_gpu/_broadcast.py's offset_terms: the operand's batch dimensions,
// broadcast ones left out, neighbours merged; unused terms are (1, 1, 0)). The
// same values as block_offsets computes on the host, without a host array of
// one entry per problem or its copy to the device.
__global__ void batch_offsets(long long* __restrict__ out, long long total, long long i0, long long n0,
                              long long s0, long long i1, long long n1, long long s1, long long i2, long long n2,
                              long long s2, long long i3, long long n3, long long s3) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        out[t] = (t / i0) % n0 * s0 + (t / i1) % n1 * s1 + (t / i2) % n2 * s2 + (t / i3) % n3 * s3;
    }
}

// The pointer arrays of cuBLAS's batched routines, both in one pass (bytes): problem t's
// factorization a_base + lu_index[t] * a_bytes (a repeated index repeats a matrix: a
// broadcast LU is never copied) and its right-hand sides w_base + t * w_bytes.
__global__ void batch_pointers(unsigned long long* __restrict__ a_ptrs, unsigned long long* __restrict__ w_ptrs,
                               const long long* __restrict__ lu_index, unsigned long long a_base,
                               long long a_bytes, unsigned long long w_base, long long w_bytes, long long nprob) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < nprob; t += stride) {
        a_ptrs[t] = a_base + (unsigned long long)(lu_index[t] * a_bytes);
        w_ptrs[t] = w_base + (unsigned long long)(t * w_bytes);
    }
}

// Right-hand sides for the solvers, in one pass: the broadcast copy of B, the
// row permutation of A X = B, and the conjugation of X A^H = B's transposed
// form. The output w[t, r, :] (column r of problem t's right-hand side,
// length n) is contiguous, the layout cuBLAS and the small solver read.
//
// b is read through element strides: problem t's block starts at
// b + b_offset[t] (so a broadcast B is never copied first), right-hand side r
// at + r * s_rhs and row i at + i * s_row. With use_perm, row i of the output
// is row perm[lu_index[t], i] of B (x = P^T b, i.e. B[perm]).
template <typename T>
__global__ void gather_rhs(const T* __restrict__ b, const long long* __restrict__ b_offset, long long s_rhs,
                           long long s_row, T* __restrict__ w, const int* __restrict__ perm,
                           const long long* __restrict__ lu_index, long long nprob, int nrhs, int n, int use_perm,
                           int conjugate) {
    const long long total = nprob * (long long)nrhs * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long vec = t / n;
        const int i = (int)(t - vec * n);
        const long long prob = vec / nrhs;
        const int r = (int)(vec - prob * nrhs);
        const int row = use_perm ? perm[lu_index[prob] * n + i] : i;
        w[t] = maybe_conj(b[b_offset[prob] + r * s_rhs + row * s_row], conjugate);
    }
}

// The inverse row permutation after the transposed / adjoint triangular solves:
// x[perm[i]] = w[i] (x = P w), problem t using the row order of factorization
// lu_index[t]. Out of place: every element is written exactly once.
template <typename T>
__global__ void scatter_rows(const T* __restrict__ w, T* __restrict__ x, const int* __restrict__ perm,
                             const long long* __restrict__ lu_index, long long nprob, int nrhs, int n) {
    const long long total = nprob * (long long)nrhs * n;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
        const long long vec = t / n;
        const int i = (int)(t - vec * n);
        const long long prob = vec / nrhs;
        x[vec * n + perm[lu_index[prob] * n + i]] = w[t];
    }
}

// Pivoting-free LU with LAPACK getf2's rule for an exact zero pivot (record
// info, skip the scaling, go on), the CPU backend's semantics: finite input
// gives finite output. cuSOLVER / cuBLAS without pivots divide by the zero
// instead (NaN / Inf), so the matrices they flag (info[b] != 0) are factored
// again here from the kept input; the others return at once. One block per
// matrix, column-major storage (a(i, j) at s[j * m + i]), the matrix in
// global memory: meant for the rare singular matrix, not for speed.
template <typename T>
__global__ void nopivot_refactor(const T* __restrict__ orig, T* __restrict__ s, int* __restrict__ info,
                                 long long nbatch, int m, int n) {
    const int kk = m < n ? m : n;
    const long long per = (long long)m * n;
    for (long long b = blockIdx.x; b < nbatch; b += gridDim.x) {
        if (info[b] == 0) continue;  // uniform across the block
        const T* src = orig + b * per;
        T* a = s + b * per;
        for (long long e = threadIdx.x; e < per; e += blockDim.x) a[e] = src[e];
        __syncthreads();
        int first_zero = 0;
        for (int j = 0; j < kk; ++j) {
            const T d = a[(long long)j * m + j];
            if (d == T(0)) {
                if (first_zero == 0) first_zero = j + 1;
            } else if (reciprocal_is_safe(d)) {
                const T r = quotient(T(1), d);
                for (int i = j + 1 + threadIdx.x; i < m; i += blockDim.x) a[(long long)j * m + i] *= r;
            } else {  // a subnormal pivot: its reciprocal overflows
                for (int i = j + 1 + threadIdx.x; i < m; i += blockDim.x) {
                    a[(long long)j * m + i] = quotient(a[(long long)j * m + i], d);
                }
            }
            __syncthreads();
            const int rows = m - j - 1;
            const long long work = (long long)rows * (n - j - 1);
            for (long long e = threadIdx.x; e < work; e += blockDim.x) {
                const int c = j + 1 + (int)(e / rows);
                const int i = j + 1 + (int)(e - (long long)(c - j - 1) * rows);
                const T f = a[(long long)c * m + j];
                if (f != T(0)) a[(long long)c * m + i] -= a[(long long)j * m + i] * f;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) info[b] = first_zero;
        __syncthreads();
    }
}
