// CUDA's execution model on the host, for the GPU backend's own kernels.
//
// Not a GPU and not a CUDA compiler: a check of the kernels' logic where no
// device is lent. The kernel sources (kernels.cu, small_lu.cu, unchanged but for
// the `extern __shared__` declarations, see simt.py) are compiled by the host
// C++ compiler against this header and launched with the backend's own launch
// shapes (lu_core/_gpu/_launch.py). Every thread of a block is a fiber (its own
// stack, switched with swapcontext) of one OS thread, which runs until it reaches
// a barrier or leaves the kernel, then hands over to the next fiber that can go
// on. (An OS thread per CUDA thread spent most of a 32 x 32 factor's time in the
// operating system: 128 threads switched at every shuffle, 333,000 context
// switches in one launch on two cores.) Each thread runs its part of every block in turn (CUDA promises no
// order between blocks). What is emulated, and checked on the way:
//
// * __syncthreads, __syncwarp: barriers of the block's / the warp's threads.
//   A thread that never arrives (divergence around a barrier: no fiber can go
//   on, found at once), or that has left the kernel while others wait, stops
//   the run with a message. A thread hands over only at a barrier or when it
//   leaves the kernel: one that waited for another's write in a loop without a
//   barrier would hang (until the Python side's timeout); no kernel does.
// * __shfl_sync, __shfl_xor_sync: the warp's lanes exchange values through a
//   barrier. Only the full mask is used by the kernels and emulated; all 32
//   lanes must reach the same shuffle, otherwise the run stops (on the device:
//   undefined behaviour). A width below 32 (a power of two) splits the warp
//   into segments of that many lanes, as CUDA does: __shfl_sync reads lane
//   src % width of the reader's own segment; __shfl_xor_sync must stay inside
//   it (CUDA would hand a lane whose partner is in a later segment its own
//   value; the kernels never ask, so the run stops). "The same shuffle" is the same call
//   site two calls deep (the intrinsic's site and its caller's, from return
//   addresses: the build keeps frame pointers and inlines nothing), so a
//   helper such as small_lu.cu's shfl() called from two places counts twice.
//   A shuffle is a barrier here, so ThreadSanitizer sees it order memory, which
//   on the device it does not: a lane's write read by another lane after a
//   shuffle but no __syncwarp goes unreported. (The other way, a read before a
//   shuffle whose result another lane needs before it writes, is safe on the
//   device by causality, and the kernels rely on it: group_pivot's reads, all
//   of which feed its shuffles, then the row swap.)
// * dynamic shared memory: a heap block of exactly the launch's size per
//   block, so AddressSanitizer reports any access beyond it; global buffers
//   are heap blocks of exactly their arrays' sizes (runner.cpp).
// * atomicMin on unsigned long long.
// * complex<T> is CuPy's own (<cupy/complex.cuh>, Thrust's), the header the
//   backend gives NVRTC, compiled for the host: the same arithmetic as on the
//   device (but for fused multiply-adds, which the kernels are built without).
//
// Built with AddressSanitizer + UndefinedBehaviorSanitizer (out-of-bounds
// accesses, signed overflow in index arithmetic) and, separately, with
// ThreadSanitizer (two threads touching the same memory without a barrier
// between them: a missing __syncwarp / __syncthreads). Both are told of every
// fiber switch (the sanitizers' fiber interfaces). ThreadSanitizer sees the
// fibers as threads that share nothing but what a barrier orders: each switch
// is made without synchronisation, the emulator's own bookkeeping is relaxed
// atomics (which order nothing), and a barrier orders memory by releasing, on
// arrival, a token of its generation, which each thread acquires on leaving it.
//
// Stricter than CUDA in two ways, neither met by the kernels today: a thread
// that has left the kernel while others wait at a barrier stops the run (on
// sm_70+ exited threads count as arrived at __syncthreads), and lanes must
// meet at the same __syncwarp (sm_70+ lets them meet at different ones).

#pragma once

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <ucontext.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// What CUDA puts in the global namespace and CuPy's complex.cuh (included next) uses.
using std::fabs;
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

namespace simt {

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "simt: %s\n", what);
    std::fflush(stderr);
    std::_Exit(3);
}

class Barrier;
struct Block;

// One thread of the launch: a fiber with its own stack.
struct Fiber {
    ucontext_t context{};
    void* stack = nullptr;
    std::size_t stack_bytes = 0;
    void* tsan = nullptr;  // ThreadSanitizer's state for it
    dim3 thread_idx, block_idx;
    Block* block = nullptr;
    std::atomic<const Barrier*> waiting{nullptr};  // the barrier it waits at, and that barrier's generation then
    std::atomic<unsigned long> generation{0};
    std::atomic<bool> done{false};
};

// The launch's fibers, the one running, and what the OS thread was running before them.
inline std::atomic<std::vector<Fiber>*> fibers{nullptr};
inline std::atomic<Fiber*> running{nullptr};
inline ucontext_t main_context;
inline void* main_tsan = nullptr;
inline const void* main_stack = nullptr;
inline std::size_t main_stack_bytes = 0;

inline Fiber& self() { return *running.load(std::memory_order_relaxed); }

// Happens-before for ThreadSanitizer (nothing in other builds).
inline void release(void* token) {
#ifdef __SANITIZE_THREAD__
    __tsan_release(token);
#else
    (void)token;
#endif
}
inline void acquire(void* token) {
#ifdef __SANITIZE_THREAD__
    __tsan_acquire(token);
#else
    (void)token;
#endif
}

// From fiber ``from`` (nullptr: the OS thread's own context) to ``to`` (likewise). A fiber that has
// finished never comes back, and says so, so AddressSanitizer forgets its stack.
inline void jump(Fiber* from, Fiber* to, bool finished = false) {
    running.store(to, std::memory_order_relaxed);
#ifdef __SANITIZE_ADDRESS__
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(finished ? nullptr : &fake_stack, to ? to->stack : main_stack,
                                   to ? to->stack_bytes : main_stack_bytes);
#endif
#ifdef __SANITIZE_THREAD__
    __tsan_switch_to_fiber(to ? to->tsan : main_tsan, __tsan_switch_to_fiber_no_sync);
#endif
    if (swapcontext(from ? &from->context : &main_context, to ? &to->context : &main_context) != 0)
        fail("swapcontext failed");
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    (void)finished;
}

inline void stuck(const Fiber& f);

inline bool can_go_on(const Fiber& f);

// ``me`` cannot go on (it waits, or has finished): the next fiber that can, in turn, runs; once every
// fiber has finished, the OS thread's own context; if none can go on and some have not finished, the
// run stops (a deadlock: threads wait at barriers that the others never reach).
inline void hand_over(Fiber& me) {
    std::vector<Fiber>& all = *fibers.load(std::memory_order_relaxed);
    const std::size_t n = all.size(), i = static_cast<std::size_t>(&me - all.data());
    for (std::size_t k = 1; k <= n; ++k) {
        Fiber& next = all[(i + k) % n];
        if (can_go_on(next)) {
            if (&next != &me) jump(&me, &next, me.done.load(std::memory_order_relaxed));
            return;
        }
    }
    for (const Fiber& f : all) {
        if (!f.done.load(std::memory_order_relaxed)) stuck(f);
    }
    jump(&me, nullptr, true);
}

class Barrier {
  public:
    explicit Barrier(int expected) : expected_(expected) {}

    // ``site`` tells the barrier's call sites apart (see shuffle below); ``line`` is for messages.
    void arrive_and_wait(const char* what, int line, std::uintptr_t site = 0, std::uintptr_t caller = 0) {
        const int arrived = arrived_.load(std::memory_order_relaxed);
        if (arrived == 0) {
            what_.store(what, std::memory_order_relaxed);
            line_.store(line, std::memory_order_relaxed);
            site_.store(site, std::memory_order_relaxed);
            caller_.store(caller, std::memory_order_relaxed);
        } else if (line != line_.load(std::memory_order_relaxed) || site != site_.load(std::memory_order_relaxed) ||
                   caller != caller_.load(std::memory_order_relaxed) ||
                   std::strcmp(what, what_.load(std::memory_order_relaxed)) != 0) {
            char msg[256];
            std::snprintf(msg, sizeof msg, "%s at line %d while others wait at %s at line %d (divergent barrier)",
                          what, line, what_.load(std::memory_order_relaxed), line_.load(std::memory_order_relaxed));
            fail(msg);
        }
        check_exited(what, line);
        const unsigned long generation = generation_.load(std::memory_order_relaxed);
        void* token = &tokens_[generation & 1];  // no thread arrives at generation + 2 before all have left this one
        release(token);
        if (arrived + 1 == expected_) {
            arrived_.store(0, std::memory_order_relaxed);
            generation_.store(generation + 1, std::memory_order_relaxed);
        } else {
            arrived_.store(arrived + 1, std::memory_order_relaxed);
            Fiber& me = self();
            me.generation.store(generation, std::memory_order_relaxed);
            me.waiting.store(this, std::memory_order_relaxed);
            hand_over(me);
            me.waiting.store(nullptr, std::memory_order_relaxed);
        }
        acquire(token);
    }

    bool passed(unsigned long generation) const { return generation_.load(std::memory_order_relaxed) != generation; }

    // A thread has left the kernel: any barrier it is part of can no longer complete.
    void leave() {
        exited_.fetch_add(1, std::memory_order_relaxed);
        if (arrived_.load(std::memory_order_relaxed) > 0) check_exited("barrier", line_.load(std::memory_order_relaxed));
    }

    [[noreturn]] void never_completes() const {
        check_exited(what_.load(std::memory_order_relaxed), line_.load(std::memory_order_relaxed));
        char msg[256];
        std::snprintf(msg, sizeof msg, "%s at line %d: %d of %d threads arrived, the rest never did",
                      what_.load(std::memory_order_relaxed), line_.load(std::memory_order_relaxed),
                      arrived_.load(std::memory_order_relaxed), expected_);
        fail(msg);
    }

  private:
    void check_exited(const char* what, int line) const {
        const int exited = exited_.load(std::memory_order_relaxed);
        if (exited > 0) {
            char msg[256];
            std::snprintf(msg, sizeof msg, "%s at line %d waits for %d thread(s) that have left the kernel", what,
                          line, exited);
            fail(msg);
        }
    }

    const int expected_;
    std::atomic<int> arrived_{0};
    std::atomic<int> exited_{0};
    std::atomic<const char*> what_{""};
    std::atomic<int> line_{0};
    std::atomic<std::uintptr_t> site_{0}, caller_{0};
    std::atomic<unsigned long> generation_{0};
    char tokens_[2] = {};  // ThreadSanitizer's sync objects, one per parity of the generation
};

inline bool can_go_on(const Fiber& f) {
    if (f.done.load(std::memory_order_relaxed)) return false;
    const Barrier* b = f.waiting.load(std::memory_order_relaxed);
    return b == nullptr || b->passed(f.generation.load(std::memory_order_relaxed));
}

inline void stuck(const Fiber& f) {
    const Barrier* b = f.waiting.load(std::memory_order_relaxed);
    if (b) b->never_completes();
    fail("a thread that can neither go on nor has finished");
}

struct Warp {
    Barrier barrier{32};
    alignas(16) unsigned char slot[32][16];
};

struct Block {
    explicit Block(int threads, std::size_t shared_bytes)
        : barrier(threads), warps(threads / 32), shared(std::malloc(shared_bytes ? shared_bytes : 1)) {
        if (!shared) fail("out of memory for shared memory");
    }
    ~Block() { std::free(shared); }
    Barrier barrier;
    std::vector<Warp> warps;
    void* shared;
};

inline dim3 grid_dim, block_dim;

template <typename T>
T* dynamic_shared() {
    return static_cast<T*>(self().block->shared);
}

inline Warp& warp() {
    if (block_dim.x % 32 != 0) fail("a warp operation in a block that is not a whole number of warps");
    return self().block->warps[self().thread_idx.x / 32];
}

inline void syncthreads(int line) { self().block->barrier.arrive_and_wait("__syncthreads", line); }

inline void syncwarp(int line, unsigned mask = 0xffffffffu) {
    if (mask != 0xffffffffu) fail("__syncwarp with a partial mask (not emulated)");
    warp().barrier.arrive_and_wait("__syncwarp", line);
}

// A shuffle: each lane's value through its slot, between two barriers of the warp.
template <typename T>
T shuffle(int line, std::uintptr_t site, std::uintptr_t caller, unsigned mask, T value, int width,
          int source_of(int lane, int arg, int width), int arg) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 16, "shuffle of this type");
    if (mask != 0xffffffffu) fail("shuffle with a partial mask (not emulated)");
    if (width < 1 || width > 32 || (width & (width - 1))) fail("shuffle width not a power of two up to 32");
    Warp& w = warp();
    const int lane = static_cast<int>(self().thread_idx.x % 32);
    std::memcpy(w.slot[lane], &value, sizeof(T));
    w.barrier.arrive_and_wait("shuffle", line, site, caller);  // every lane's value is in its slot
    const int source = source_of(lane, arg, width);
    if (source < 0) fail("__shfl_xor_sync to a lane outside the segment of width lanes (not emulated)");
    T out;
    std::memcpy(&out, w.slot[source], sizeof(T));
    w.barrier.arrive_and_wait("shuffle", line, site, caller);  // every lane has read before any slot changes
    return out;
}

// The lane a shuffle reads, in the reader's segment of width lanes; -1 where not emulated.
inline int from_lane(int lane, int src, int width) { return (lane & ~(width - 1)) | (src & (width - 1)); }
inline int xor_lane(int lane, int mask, int width) {
    const int source = lane ^ mask;
    return (source & ~(width - 1)) == (lane & ~(width - 1)) && source < 32 ? source : -1;
}

// Called by the intrinsics' macros, never inlined: return address 0 is the intrinsic's site, 1 its caller's
// (safe here: the whole build keeps frame pointers).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wframe-address"
template <typename T>
__attribute__((noinline)) T shfl_idx(int line, unsigned mask, T value, int src, int width = 32) {
    const auto site = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
    const auto caller = reinterpret_cast<std::uintptr_t>(__builtin_return_address(1));
    return shuffle(line, site, caller, mask, value, width, from_lane, src);
}

template <typename T>
__attribute__((noinline)) T shfl_xor(int line, unsigned mask, T value, int lanes, int width = 32) {
    const auto site = reinterpret_cast<std::uintptr_t>(__builtin_return_address(0));
    const auto caller = reinterpret_cast<std::uintptr_t>(__builtin_return_address(1));
    return shuffle(line, site, caller, mask, value, width, xor_lane, lanes);
}
#pragma GCC diagnostic pop

}  // namespace simt

#define __global__
#define __host__
#define __device__
#define __forceinline__ inline
#define __align__(n) alignas(n)
#define threadIdx (simt::self().thread_idx)
#define blockIdx (simt::self().block_idx)
#define blockDim simt::block_dim
#define gridDim simt::grid_dim
#define __syncthreads() simt::syncthreads(__LINE__)
#define __syncwarp(...) simt::syncwarp(__LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) simt::shfl_idx(__LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) simt::shfl_xor(__LINE__, __VA_ARGS__)

// Relaxed, as the device's atomicMin: it orders no other memory (ThreadSanitizer sees no edge through it).
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
    std::atomic_ref<unsigned long long> a(*address);
    unsigned long long old = a.load(std::memory_order_relaxed);
    while (value < old && !a.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
    }
    return old;
}
