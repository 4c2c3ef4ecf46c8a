// The block-wide reductions the row and channel kernels share, put in front of every source that
// uses them (kernel_sources.rs): FERRITE_BLOCK threads reduce through shared memory with a fixed
// tree, so the order of operations depends only on the block size, never on timing — the result is
// the same on every run. A block calling these must have exactly FERRITE_BLOCK threads.

#define FERRITE_BLOCK 256
// -inf without <math.h> (NVRTC has no standard headers).
#define FERRITE_NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float block_sum(float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = FERRITE_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    float r = shared[0];
    __syncthreads();
    return r;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = FERRITE_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    float r = shared[0];
    __syncthreads();
    return r;
}
