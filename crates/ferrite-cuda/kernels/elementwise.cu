// Elementwise kernels (f32): binary ops with broadcasting over up to 6 dimensions through strides
// (a stride of 0 broadcasts), and unary ops on contiguous buffers. One thread per output element,
// grid-stride loop so any launch size covers any length.

#define FERRITE_MAX_DIMS 6

// Shape of the output and the element strides of both inputs (0 where an input broadcasts).
struct Broadcast {
    int ndim;
    long long shape[FERRITE_MAX_DIMS];
    long long a_stride[FERRITE_MAX_DIMS];
    long long b_stride[FERRITE_MAX_DIMS];
};

__device__ __forceinline__ void offsets(const Broadcast& g, long long i, long long* a, long long* b) {
    long long oa = 0, ob = 0;
    for (int d = g.ndim - 1; d >= 0; --d) {
        long long idx = i % g.shape[d];
        i /= g.shape[d];
        oa += idx * g.a_stride[d];
        ob += idx * g.b_stride[d];
    }
    *a = oa;
    *b = ob;
}

#define FERRITE_BINARY(name, expr)                                                               \
    extern "C" __global__ void name(long long n, Broadcast g, const float* __restrict__ a,        \
                                    const float* __restrict__ b, float* __restrict__ out) {       \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            float x = a[ia];                                                                      \
            float y = b[ib];                                                                      \
            out[i] = (expr);                                                                      \
        }                                                                                         \
    }

FERRITE_BINARY(add_f32, x + y)
FERRITE_BINARY(sub_f32, x - y)
FERRITE_BINARY(mul_f32, x * y)
FERRITE_BINARY(div_f32, x / y)
FERRITE_BINARY(maximum_f32, fmaxf(x, y))
FERRITE_BINARY(minimum_f32, fminf(x, y))
FERRITE_BINARY(pow_f32, powf(x, y))

#define FERRITE_UNARY(name, expr)                                                                \
    extern "C" __global__ void name(long long n, const float* __restrict__ a,                     \
                                    float* __restrict__ out) {                                    \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            float x = a[i];                                                                       \
            out[i] = (expr);                                                                      \
        }                                                                                         \
    }

FERRITE_UNARY(neg_f32, -x)
FERRITE_UNARY(exp_f32, expf(x))
FERRITE_UNARY(log_f32, logf(x))
FERRITE_UNARY(sqrt_f32, sqrtf(x))
FERRITE_UNARY(rsqrt_f32, rsqrtf(x))
// NaN passes through, as PyTorch's relu (clamp_min) does.
FERRITE_UNARY(relu_f32, (x > 0.0f || x != x) ? x : 0.0f)
FERRITE_UNARY(sigmoid_f32, 1.0f / (1.0f + expf(-x)))
FERRITE_UNARY(tanh_f32, tanhf(x))
FERRITE_UNARY(silu_f32, x / (1.0f + expf(-x)))
// PyTorch's gelu(approximate='none') and 'tanh' (GPT-2's gelu_new).
FERRITE_UNARY(gelu_f32, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)))
FERRITE_UNARY(gelu_tanh_f32,
              0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))))
FERRITE_UNARY(abs_f32, fabsf(x))
FERRITE_UNARY(sin_f32, sinf(x))
FERRITE_UNARY(cos_f32, cosf(x))
FERRITE_UNARY(log1p_f32, log1pf(x))
FERRITE_UNARY(reciprocal_f32, 1.0f / x)
FERRITE_UNARY(square_f32, x * x)

// The unary ops with a scalar parameter: x ** p and leaky_relu (x > 0 ? x : x * p).
#define FERRITE_UNARY_PARAM(name, expr)                                                          \
    extern "C" __global__ void name(long long n, float p, const float* __restrict__ a,            \
                                    float* __restrict__ out) {                                    \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            float x = a[i];                                                                       \
            out[i] = (expr);                                                                      \
        }                                                                                         \
    }

FERRITE_UNARY_PARAM(pow_scalar_f32, powf(x, p))
FERRITE_UNARY_PARAM(leaky_relu_f32, x > 0.0f ? x : x * p)

// Logical and/or of two bool tensors with broadcasting (any nonzero byte is true).
#define FERRITE_LOGICAL(name, expr)                                                              \
    extern "C" __global__ void name(long long n, Broadcast g, const unsigned char* __restrict__ a, \
                                    const unsigned char* __restrict__ b, unsigned char* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            bool x = a[ia] != 0;                                                                  \
            bool y = b[ib] != 0;                                                                  \
            out[i] = (expr) ? 1 : 0;                                                              \
        }                                                                                         \
    }

FERRITE_LOGICAL(and_bool, x && y)
FERRITE_LOGICAL(or_bool, x || y)

// out = a * alpha + b * beta (axpby), the building block of fused updates.
extern "C" __global__ void axpby_f32(long long n, float alpha, const float* __restrict__ a, float beta,
                                     const float* __restrict__ b, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = a[i] * alpha + b[i] * beta;
    }
}

extern "C" __global__ void fill_f32(long long n, float value, float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}

// Comparisons with broadcasting: out = (x OP y) as a byte (PyTorch's bool tensors; NaN compares
// false except for `ne`).
#define FERRITE_COMPARE(name, expr)                                                              \
    extern "C" __global__ void name(long long n, Broadcast g, const float* __restrict__ a,        \
                                    const float* __restrict__ b, unsigned char* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            float x = a[ia];                                                                      \
            float y = b[ib];                                                                      \
            out[i] = (expr) ? 1 : 0;                                                              \
        }                                                                                         \
    }

FERRITE_COMPARE(eq_f32, x == y)
FERRITE_COMPARE(ne_f32, x != y)
FERRITE_COMPARE(lt_f32, x < y)
FERRITE_COMPARE(le_f32, x <= y)
FERRITE_COMPARE(gt_f32, x > y)
FERRITE_COMPARE(ge_f32, x >= y)

// The same comparisons on int64 values (exact beyond f32's 2^24: labels, indices, counts).
#define FERRITE_COMPARE_I64(name, expr)                                                          \
    extern "C" __global__ void name(long long n, Broadcast g, const long long* __restrict__ a,    \
                                    const long long* __restrict__ b, unsigned char* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            long long x = a[ia];                                                                  \
            long long y = b[ib];                                                                  \
            out[i] = (expr) ? 1 : 0;                                                              \
        }                                                                                         \
    }

FERRITE_COMPARE_I64(eq_i64, x == y)
FERRITE_COMPARE_I64(ne_i64, x != y)
FERRITE_COMPARE_I64(lt_i64, x < y)
FERRITE_COMPARE_I64(le_i64, x <= y)
FERRITE_COMPARE_I64(gt_i64, x > y)
FERRITE_COMPARE_I64(ge_i64, x >= y)

// where(cond, a, b) with each operand broadcast to the output through its own strides.
struct Broadcast3 {
    int ndim;
    long long shape[FERRITE_MAX_DIMS];
    long long c_stride[FERRITE_MAX_DIMS];
    long long a_stride[FERRITE_MAX_DIMS];
    long long b_stride[FERRITE_MAX_DIMS];
};

extern "C" __global__ void where_f32(long long n, Broadcast3 g, const unsigned char* __restrict__ cond,
                                     const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, oc = 0, oa = 0, ob = 0;
        for (int d = g.ndim - 1; d >= 0; --d) {
            long long idx = rest % g.shape[d];
            rest /= g.shape[d];
            oc += idx * g.c_stride[d];
            oa += idx * g.a_stride[d];
            ob += idx * g.b_stride[d];
        }
        out[i] = cond[oc] ? a[oa] : b[ob];
    }
}

// where on raw elements of one width (any dtype of that width: int64, bool, f16, ...): the
// selection moves values, it computes nothing.
#define FERRITE_WHERE(name, T)                                                                   \
    extern "C" __global__ void name(long long n, Broadcast3 g, const unsigned char* __restrict__ cond, \
                                    const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long rest = i, oc = 0, oa = 0, ob = 0;                                           \
            for (int d = g.ndim - 1; d >= 0; --d) {                                               \
                long long idx = rest % g.shape[d];                                                \
                rest /= g.shape[d];                                                               \
                oc += idx * g.c_stride[d];                                                        \
                oa += idx * g.a_stride[d];                                                        \
                ob += idx * g.b_stride[d];                                                        \
            }                                                                                     \
            out[i] = cond[oc] ? a[oa] : b[ob];                                                    \
        }                                                                                         \
    }

FERRITE_WHERE(where_b8, unsigned char)
FERRITE_WHERE(where_b16, unsigned short)
FERRITE_WHERE(where_b32, unsigned int)
FERRITE_WHERE(where_b64, unsigned long long)

// clamp(x, lo, hi) as PyTorch's min(max(x, lo), hi): NaN stays NaN, hi wins when lo > hi, and a
// bound that is NaN makes the result NaN.
extern "C" __global__ void clamp_f32(long long n, float lo, float hi, const float* __restrict__ x,
                                     float* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i];
        if (lo != lo || hi != hi) v = lo != lo ? lo : hi;
        else if (v == v) {
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
        }
        out[i] = v;
    }
}
