// The launcher of the emulated kernels (see simt.h): one launch per process.
//
//     runner SPEC
//
// SPEC is a text file, one item per line:
//
//     kernel SOURCE NAME           a name expression of _sources.SOURCES, e.g. small_lu.cu small_getrf<double>
//     launch GRID BLOCK SHARED     one-dimensional grid and block, dynamic shared memory in bytes
//     buf PATH BYTES KIND ITEMSIZE [FIRST]
//                                  a pointer argument: the file's bytes, read before and written back after;
//                                  KIND and ITEMSIZE are the array's NumPy dtype's (f, c, i, u; bytes); the
//                                  kernel gets a pointer to item FIRST (default 0), as CuPy passes a view
//                                  that starts inside its allocation (simt.At)
//     int BYTES SIGNED VALUE       an integer argument of that width and signedness
//
// Arguments must match the kernel's parameters in number, kind (pointer or
// integer), integer width and signedness (as CuPy requires of a launch's NumPy
// scalars) and pointed-to type (float, double, complex<float>, complex<double>
// or an integer of the array's width and signedness): a mismatch stops the run. Each buffer lives in a heap block of
// exactly its size, so AddressSanitizer reports a kernel reading or writing
// past an array's end.
//
// The file that includes this one defines simt_entries, from the kernels.

#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include <sys/mman.h>

#include "simt.h"

namespace simt {

struct Arg {
    bool is_buffer = false;
    void* ptr = nullptr;
    std::size_t bytes = 0;  // buffer size, or the integer's width
    bool is_signed = false;
    long long value = 0;
    char kind = 0;  // a buffer's NumPy dtype kind and item size
    std::size_t itemsize = 0;
    std::size_t first = 0;  // the item the kernel's pointer points at
};

template <typename T>
struct is_complex : std::false_type {};
template <typename T>
struct is_complex<complex<T>> : std::true_type {};  // CuPy's (Thrust's), from the prelude

// The NumPy kind of what a kernel's pointer parameter points to.
template <typename E>
constexpr char kind_of() {
    if constexpr (is_complex<E>::value) return 'c';
    else if constexpr (std::is_floating_point<E>::value) return 'f';
    else if constexpr (std::is_integral<E>::value) return std::is_signed<E>::value ? 'i' : 'u';
    else return '?';
}

template <typename P>
P convert(const Arg& a, std::size_t index) {
    char msg[200];
    if constexpr (std::is_pointer<P>::value) {
        using E = typename std::remove_cv<typename std::remove_pointer<P>::type>::type;
        if (!a.is_buffer) {
            std::snprintf(msg, sizeof msg, "argument %zu: the kernel takes a pointer, the launch gives an integer",
                          index);
            fail(msg);
        }
        if (a.kind != kind_of<E>() || a.itemsize != sizeof(E)) {
            std::snprintf(msg, sizeof msg,
                          "argument %zu: the kernel takes a pointer to %zu-byte items of kind %c, the launch gives "
                          "an array of %zu-byte items of kind %c",
                          index, sizeof(E), kind_of<E>(), a.itemsize, a.kind);
            fail(msg);
        }
        return reinterpret_cast<P>(static_cast<char*>(a.ptr) + a.first * a.itemsize);
    } else {
        static_assert(std::is_integral<P>::value, "kernel parameters are pointers or integers");
        if (a.is_buffer || a.bytes != sizeof(P) || a.is_signed != std::is_signed<P>::value) {
            std::snprintf(msg, sizeof msg,
                          "argument %zu: the kernel takes a %zu-byte %s integer, the launch gives %s", index,
                          sizeof(P), std::is_signed<P>::value ? "signed" : "unsigned",
                          a.is_buffer ? "a buffer" : (a.is_signed ? "a signed integer" : "an unsigned integer"));
            fail(msg);
        }
        return static_cast<P>(a.value);
    }
}

struct Entry {
    const char* source;
    const char* name;
    std::size_t arity;
    std::function<void(const std::vector<Arg>&)> call;
};

template <typename... P, std::size_t... I>
void call_with(void (*kernel)(P...), const std::vector<Arg>& args, std::index_sequence<I...>) {
    kernel(convert<P>(args[I], I)...);
}

template <typename... P>
std::pair<std::size_t, std::function<void(const std::vector<Arg>&)>> entry(void (*kernel)(P...)) {
    return {sizeof...(P), [kernel](const std::vector<Arg>& args) {
                call_with(kernel, args, std::index_sequence_for<P...>{});
            }};
}

// The body of each fiber: its thread's part of every block in turn (a block's threads run together,
// blocks one after another per thread; two blocks may overlap, as on a device).
inline const Entry* launched = nullptr;
inline const std::vector<Arg>* launch_args = nullptr;
inline const std::vector<std::unique_ptr<Block>>* launch_blocks = nullptr;
// ThreadSanitizer's sync objects: the launch's set-up before every thread, every thread before the results.
inline char start_token, end_token;

inline void fiber_main() {
#ifdef __SANITIZE_ADDRESS__
    const void* from = nullptr;
    std::size_t from_bytes = 0;
    __sanitizer_finish_switch_fiber(nullptr, &from, &from_bytes);
    if (!main_stack) {  // the first thread starts from the OS thread's own stack, the others from a thread's
        main_stack = from;
        main_stack_bytes = from_bytes;
    }
#endif
    Fiber& me = self();
    acquire(&start_token);
    const unsigned threads = block_dim.x;
    for (unsigned b = 0; b < grid_dim.x; ++b) {
        me.block_idx = dim3{b, 1, 1};
        me.block = (*launch_blocks)[b].get();
        launched->call(*launch_args);
        me.block->barrier.leave();
        if (threads % 32 == 0) me.block->warps[me.thread_idx.x / 32].barrier.leave();
    }
    release(&end_token);
    me.done.store(true, std::memory_order_relaxed);
    hand_over(me);  // never returns
    fail("a finished thread ran again");
}

// One launch per process: its blocks and fibers stay until the process exits (freeing them would be a
// write that ThreadSanitizer cannot order after the finished threads' last reads of the fibers' states,
// in hand_over, after they released end_token).
inline void launch(const Entry& e, const std::vector<Arg>& args, unsigned grid, unsigned threads,
                   std::size_t shared) {
    // A thread's stack: the kernels' deepest use measured 8 KiB under either sanitizer (pages touched, the
    // whole emulated suite); below it an inaccessible guard as large, which a frame cannot jump over into
    // the next thread's stack.
    constexpr std::size_t guard = 64 * 1024, stack_bytes = 64 * 1024;
    grid_dim = dim3{grid, 1, 1};
    block_dim = dim3{threads, 1, 1};
    launched = &e;
    launch_args = &args;
    auto* blocks = new std::vector<std::unique_ptr<Block>>();
    blocks->reserve(grid);
    for (unsigned b = 0; b < grid; ++b) blocks->push_back(std::make_unique<Block>(static_cast<int>(threads), shared));
    launch_blocks = blocks;
    auto* all = new std::vector<Fiber>(threads);
    fibers.store(all, std::memory_order_relaxed);
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = (*all)[t];
        f.thread_idx = dim3{t, 1, 1};
        void* mapped = mmap(nullptr, guard + stack_bytes, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (mapped == MAP_FAILED || mprotect(mapped, guard, PROT_NONE) != 0) fail("no memory for a thread's stack");
        f.stack = static_cast<char*>(mapped) + guard;
        f.stack_bytes = stack_bytes;
        if (getcontext(&f.context) != 0) fail("getcontext failed");
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = stack_bytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_main, 0);
        // makecontext has placed the stack; swapcontext does not read uc_stack, but AddressSanitizer's
        // interceptor of it does, and marks the whole stack it names valid at every switch into the fiber:
        // the redzones of the paused kernel's own arrays would be gone after its first barrier.
        f.context.uc_stack = {};
#ifdef __SANITIZE_THREAD__
        f.tsan = __tsan_create_fiber(0);
        char name[32];
        std::snprintf(name, sizeof name, "threadIdx.x=%u", t);
        __tsan_set_fiber_name(f.tsan, name);  // in its reports
#endif
    }
#ifdef __SANITIZE_THREAD__
    main_tsan = __tsan_get_current_fiber();
#endif
    release(&start_token);
    jump(nullptr, &(*all)[0]);  // back here once every thread has finished
    acquire(&end_token);
#ifdef __SANITIZE_THREAD__
    for (Fiber& f : *all) __tsan_destroy_fiber(f.tsan);  // else it waits a second at exit for them to end
#endif
}

}  // namespace simt

extern const simt::Entry simt_entries[];
extern const std::size_t simt_entry_count;

int main(int argc, char** argv) {
    if (argc != 2) simt::fail("usage: runner SPEC");
    std::ifstream spec(argv[1]);
    if (!spec) simt::fail("cannot read the spec");
    std::string line, source, name;
    unsigned grid = 0, threads = 0;
    std::size_t shared = 0;
    std::vector<simt::Arg> args;
    std::vector<std::string> paths;
    while (std::getline(spec, line)) {
        std::istringstream in(line);
        std::string what;
        in >> what;
        if (what == "kernel") {
            in >> source;
            std::getline(in >> std::ws, name);
        } else if (what == "launch") {
            in >> grid >> threads >> shared;
        } else if (what == "buf") {
            simt::Arg a;
            std::string path;
            in >> path >> a.bytes >> a.kind >> a.itemsize;
            if (!(in >> a.first)) a.first = 0;
            if (a.itemsize == 0 || a.first * a.itemsize > a.bytes) simt::fail("a buffer's first item is past its end");
            a.is_buffer = true;
            a.ptr = std::malloc(a.bytes ? a.bytes : 1);
            std::ifstream f(path, std::ios::binary);
            if (!a.ptr || !f.read(static_cast<char*>(a.ptr), static_cast<std::streamsize>(a.bytes)))
                simt::fail("cannot read a buffer");
            args.push_back(a);
            paths.push_back(path);
        } else if (what == "int") {
            simt::Arg a;
            int is_signed = 0;
            in >> a.bytes >> is_signed >> a.value;
            a.is_signed = is_signed != 0;
            args.push_back(a);
            paths.emplace_back();
        } else if (!what.empty()) {
            simt::fail("unknown spec line");
        }
    }
    const simt::Entry* e = nullptr;
    for (std::size_t i = 0; i < simt_entry_count; ++i) {
        if (source == simt_entries[i].source && name == simt_entries[i].name) e = &simt_entries[i];
    }
    if (!e) simt::fail("no such kernel among the name expressions");
    if (e->arity != args.size()) simt::fail("wrong number of arguments for the kernel");
    if (grid == 0 || threads == 0 || threads > 1024) simt::fail("launch shape out of CUDA's range");
    simt::launch(*e, args, grid, threads, shared);
    for (std::size_t i = 0; i < args.size(); ++i) {
        if (!args[i].is_buffer) continue;
        std::ofstream f(paths[i], std::ios::binary | std::ios::trunc);
        f.write(static_cast<const char*>(args[i].ptr), static_cast<std::streamsize>(args[i].bytes));
        std::free(args[i].ptr);
    }
    return 0;
}
