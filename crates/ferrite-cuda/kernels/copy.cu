// Strided copies (f32): a view of any layout (a permutation, a transpose, a narrowed slice, an
// expanded dimension with stride 0) into a contiguous buffer, the way `contiguous()` and
// `copy_` materialise views. One thread per output element, grid-stride loop; the source offset
// of an output index is offset + sum(index[d] * stride[d]).

#define FERRITE_COPY_MAX_DIMS 8

struct Strided {
    int ndim;
    long long offset;
    long long shape[FERRITE_COPY_MAX_DIMS];
    long long stride[FERRITE_COPY_MAX_DIMS];
};

extern "C" __global__ void strided_copy_f32(long long n, Strided src, const float* __restrict__ in,
                                            float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i;
        long long at = src.offset;
        for (int d = src.ndim - 1; d >= 0; --d) {
            long long idx = rest % src.shape[d];
            rest /= src.shape[d];
            at += idx * src.stride[d];
        }
        out[i] = in[at];
    }
}
