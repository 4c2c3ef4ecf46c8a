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

// Element copies between any two layouts of the same shape (dst.shape; a source stride of 0
// broadcasts), moving raw elements of one width, so one kernel serves every dtype of that width:
// `copy_`, `contiguous()`, in-place results written back into a strided view.
#define FERRITE_COPY_LAYOUT(name, T)                                                             \
    extern "C" __global__ void name(long long n, Strided src, Strided dst, const T* __restrict__ in, \
                                    T* __restrict__ out) {                                        \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long rest = i, from = src.offset, to = dst.offset;                               \
            for (int d = dst.ndim - 1; d >= 0; --d) {                                             \
                long long idx = rest % dst.shape[d];                                              \
                rest /= dst.shape[d];                                                             \
                from += idx * src.stride[d];                                                      \
                to += idx * dst.stride[d];                                                        \
            }                                                                                     \
            out[to] = in[from];                                                                   \
        }                                                                                         \
    }

FERRITE_COPY_LAYOUT(copy_layout_b8, unsigned char)
FERRITE_COPY_LAYOUT(copy_layout_b16, unsigned short)
FERRITE_COPY_LAYOUT(copy_layout_b32, unsigned int)
FERRITE_COPY_LAYOUT(copy_layout_b64, unsigned long long)

// Fills: every element set to one bit pattern of its width (the value already converted to the
// dtype on the host, as the CPU backend converts it), so one kernel per width serves every dtype
// and a fill (`zeros`, `full`, a loss's constant) is a launch, never an upload. The pattern comes
// as the low bits of `bits`.
#define FERRITE_FILL(name, T)                                                                    \
    extern "C" __global__ void name(long long n, unsigned long long bits, T* __restrict__ out) {  \
        const T value = (T)bits;                                                                  \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            out[i] = value;                                                                       \
        }                                                                                         \
    }

FERRITE_FILL(fill_b8, unsigned char)
FERRITE_FILL(fill_b16, unsigned short)
FERRITE_FILL(fill_b32, unsigned int)
FERRITE_FILL(fill_b64, unsigned long long)

// arange: element i is start + i·step in double, each operation rounded on its own (__dmul_rn,
// __dadd_rn are never contracted into one fused multiply-add, which would round once), exactly the
// CPU's `start + i as f64 * step`; then converted as the CPU converts (Rust's `as`): to the
// nearest float, or toward zero and saturated for integers, NaN to 0. So position ids and other
// ranges are a launch, never an upload (a real GPU waits for every upload).
__device__ __forceinline__ double ferrite_arange_at(long long i, double start, double step) {
    return __dadd_rn(start, __dmul_rn((double)i, step));
}

#define FERRITE_ARANGE(name, T, CONVERT)                                                          \
    extern "C" __global__ void name(long long n, double start, double step, T* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;               \
             i += (long long)gridDim.x * blockDim.x) {                                             \
            const double v = ferrite_arange_at(i, start, step);                                    \
            out[i] = CONVERT;                                                                      \
        }                                                                                          \
    }

// Saturating truncation to an integer type whose range is [LO, HI] (both exact in double except
// HI of 64 bits, 2^63 − 1, whose double is 2^63: `v >= HI` then catches exactly the overflow).
#define FERRITE_SATURATE(T, LO, HI) \
    (v != v ? (T)0 : v <= (double)(LO) ? (T)(LO) : v >= (double)(HI) ? (T)(HI) : (T)v)

FERRITE_ARANGE(arange_f64, double, v)
FERRITE_ARANGE(arange_f32, float, (float)v)
FERRITE_ARANGE(arange_i64, long long, FERRITE_SATURATE(long long, (-9223372036854775807LL - 1), 9223372036854775807LL))
FERRITE_ARANGE(arange_i32, int, FERRITE_SATURATE(int, (-2147483647 - 1), 2147483647))
FERRITE_ARANGE(arange_u8, unsigned char, FERRITE_SATURATE(unsigned char, 0, 255))
