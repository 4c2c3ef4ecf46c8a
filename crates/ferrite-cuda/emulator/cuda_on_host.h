// Runs ferrite's CUDA C kernels on the CPU, for tests on machines without a GPU (CI): the kernel
// sources under kernels/ are compiled unchanged as C++20 with this header forced in front
// (`g++ -std=c++20 -include cuda_on_host.h -x c++ kernels/X.cu -shared -fPIC`), and the test
// harness (tests/emulator/mod.rs) runs one block at a time, each of its threads on an OS thread.
//
// What a kernel may use, and how it is emulated:
// - threadIdx, blockIdx, blockDim, gridDim: thread-local, set by ferrite_emu_enter before the
//   kernel is called on each thread.
// - __shared__: function-local statics. Blocks run one after another, so every thread of the
//   running block sees the same array, as on the GPU.
// - __syncthreads(): a std::barrier of the block's threads. A thread that returns from the kernel
//   leaves the barrier (arrive_and_drop), as an exited GPU thread stops counting.
// - atomicCAS and atomicMax on unsigned 64-bit words: std::atomic_ref.
// - Math: the C library's expf, logf, tanhf, erff, sqrtf, powf, fmaxf, fminf, isfinite, plus
//   rsqrtf, __int_as_float, __dmul_rn and __dadd_rn defined here. Results may differ from the
//   GPU's in the last bits (the GPU's expf is not the C library's); tests compare within
//   PyTorch's tolerances.
// Warp-level intrinsics (__shfl_*_sync) are not emulated: a kernel that needs them adds them here.
#pragma once

#include <atomic>
#include <barrier>
#include <cstring>
#include <math.h>

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
inline thread_local std::barrier<>* ferrite_emu_block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline

// Double arithmetic rounded per operation (the GPU's non-contracting intrinsics); g++ -O1 for
// x86-64 without -mfma never fuses a multiply and an add, so the plain operators are exact.
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
#define __launch_bounds__(...)
#define __shared__ static

inline void __syncthreads() { ferrite_emu_block_barrier->arrive_and_wait(); }

inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, sizeof f);
    return f;
}

inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

inline unsigned long long atomicCAS(unsigned long long* address, unsigned long long compare, unsigned long long val) {
    std::atomic_ref<unsigned long long> word(*address);
    word.compare_exchange_strong(compare, val);
    return compare;
}

inline unsigned long long atomicMax(unsigned long long* address, unsigned long long val) {
    std::atomic_ref<unsigned long long> word(*address);
    unsigned long long old = word.load();
    while (old < val && !word.compare_exchange_weak(old, val)) {
    }
    return old;
}

// The harness's entry points (C ABI, looked up by name).
extern "C" void* ferrite_emu_barrier_new(long threads) { return new std::barrier<>(threads); }
extern "C" void ferrite_emu_barrier_free(void* barrier) { delete static_cast<std::barrier<>*>(barrier); }
extern "C" void ferrite_emu_enter(const unsigned int* thread, const unsigned int* block, const unsigned int* block_dim,
                                  const unsigned int* grid_dim, void* barrier) {
    threadIdx = {thread[0], thread[1], thread[2]};
    blockIdx = {block[0], block[1], block[2]};
    blockDim = {block_dim[0], block_dim[1], block_dim[2]};
    gridDim = {grid_dim[0], grid_dim[1], grid_dim[2]};
    ferrite_emu_block_barrier = static_cast<std::barrier<>*>(barrier);
}
extern "C" void ferrite_emu_leave() {
    ferrite_emu_block_barrier->arrive_and_drop();
    ferrite_emu_block_barrier = nullptr;
}

// The launch array (one pointer per parameter, to its value, as cuLaunchKernel takes it)
// unpacked into a kernel's parameters; the types come from the kernel's own signature.
#include <type_traits>
#include <utility>

template <class... A, std::size_t... I>
inline void ferrite_emu_apply_at(void (*kernel)(A...), void** p, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}

template <class... A>
inline void ferrite_emu_apply(void (*kernel)(A...), void** p) {
    ferrite_emu_apply_at(kernel, p, std::index_sequence_for<A...>{});
}
