// Elementwise kernels: binary ops with broadcasting over up to 6 dimensions through strides (a
// stride of 0 broadcasts), binary ops with an f32 scalar, and unary ops on contiguous buffers. The
// arithmetic ones exist for f32, f16 and bf16 (names ending _f32, _f16, _bf16; half.cuh's element
// types): half operands are loaded into f32, computed in registers and rounded once on store, as
// the CPU backend computes them. One thread per output element, grid-stride loop so any launch
// size covers any length.

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

// The inputs are not `__restrict__`: an in-place op passes its destination as `a` (or `b`) and
// `out`, each element read and then written by one thread.
#define FERRITE_BINARY_AS(name, sfx, E, T)                                                       \
    extern "C" __global__ void name##_##sfx(long long n, Broadcast g, const T* a, const T* b, T* out) { \
        name##_body<E>(n, g, a, b, out);                                                          \
    }
#define FERRITE_BINARY(name, expr)                                                               \
    template <class E>                                                                            \
    __device__ __forceinline__ void name##_body(long long n, const Broadcast& g, const typename E::T* a, \
                                                const typename E::T* b, typename E::T* out) {     \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            float x = E::load(a[ia]);                                                             \
            float y = E::load(b[ib]);                                                             \
            out[i] = E::store(expr);                                                              \
        }                                                                                         \
    }                                                                                             \
    FERRITE_BINARY_AS(name, f32, ElemF32, float)                                                  \
    FERRITE_BINARY_AS(name, f16, ElemF16, unsigned short)                                         \
    FERRITE_BINARY_AS(name, bf16, ElemBF16, unsigned short)

FERRITE_BINARY(add, x + y)
FERRITE_BINARY(sub, x - y)
FERRITE_BINARY(mul, x * y)
FERRITE_BINARY(div, x / y)
FERRITE_BINARY(maximum, fmaxf(x, y))
FERRITE_BINARY(minimum, fminf(x, y))
FERRITE_BINARY(pow, powf(x, y))

// A binary op with an f32 scalar `y` (what the CPU computes for `x op s`: the scalar rounded to
// f32, never to the element type), `x` read through `g`'s `a` strides (its `b` strides unused), so
// strided and broadcast inputs need no copy; the reversed forms (s - x, s / x) are their own ops.
#define FERRITE_SCALAR_AS(name, sfx, E, T)                                                       \
    extern "C" __global__ void scalar_##name##_##sfx(long long n, Broadcast g, float y, const T* a, T* out) { \
        scalar_##name##_body<E>(n, g, y, a, out);                                                 \
    }
#define FERRITE_SCALAR(name, expr)                                                               \
    template <class E>                                                                            \
    __device__ __forceinline__ void scalar_##name##_body(long long n, const Broadcast& g, float y, \
                                                         const typename E::T* a, typename E::T* out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            float x = E::load(a[ia]);                                                             \
            out[i] = E::store(expr);                                                              \
        }                                                                                         \
    }                                                                                             \
    FERRITE_SCALAR_AS(name, f32, ElemF32, float)                                                  \
    FERRITE_SCALAR_AS(name, f16, ElemF16, unsigned short)                                         \
    FERRITE_SCALAR_AS(name, bf16, ElemBF16, unsigned short)

FERRITE_SCALAR(add, x + y)
FERRITE_SCALAR(sub, x - y)
FERRITE_SCALAR(mul, x * y)
FERRITE_SCALAR(div, x / y)
FERRITE_SCALAR(maximum, fmaxf(x, y))
FERRITE_SCALAR(minimum, fminf(x, y))
FERRITE_SCALAR(pow, powf(x, y))
FERRITE_SCALAR(rsub, y - x)
FERRITE_SCALAR(rdiv, y / x)

// Unary ops; `p` is the scalar of the ops that have one (x ** p, leaky_relu's slope), 0 otherwise.
#define FERRITE_UNARY_AS(name, sfx, E, T)                                                        \
    extern "C" __global__ void name##_##sfx(long long n, const T* __restrict__ a, T* __restrict__ out) { \
        name##_body<E>(n, 0.0f, a, out);                                                          \
    }
#define FERRITE_UNARY_PARAM_AS(name, sfx, E, T)                                                  \
    extern "C" __global__ void name##_##sfx(long long n, float p, const T* __restrict__ a,        \
                                            T* __restrict__ out) {                                \
        name##_body<E>(n, p, a, out);                                                             \
    }
#define FERRITE_UNARY_BODY(name, expr)                                                           \
    template <class E>                                                                            \
    __device__ __forceinline__ void name##_body(long long n, float p, const typename E::T* __restrict__ a, \
                                                typename E::T* __restrict__ out) {                \
        (void)p;                                                                                  \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            float x = E::load(a[i]);                                                              \
            out[i] = E::store(expr);                                                              \
        }                                                                                         \
    }
#define FERRITE_UNARY(name, expr)                                                                \
    FERRITE_UNARY_BODY(name, expr)                                                                \
    FERRITE_UNARY_AS(name, f32, ElemF32, float)                                                   \
    FERRITE_UNARY_AS(name, f16, ElemF16, unsigned short)                                          \
    FERRITE_UNARY_AS(name, bf16, ElemBF16, unsigned short)
#define FERRITE_UNARY_PARAM(name, expr)                                                          \
    FERRITE_UNARY_BODY(name, expr)                                                                \
    FERRITE_UNARY_PARAM_AS(name, f32, ElemF32, float)                                             \
    FERRITE_UNARY_PARAM_AS(name, f16, ElemF16, unsigned short)                                    \
    FERRITE_UNARY_PARAM_AS(name, bf16, ElemBF16, unsigned short)

FERRITE_UNARY(neg, -x)
FERRITE_UNARY(exp, expf(x))
FERRITE_UNARY(log, logf(x))
FERRITE_UNARY(sqrt, sqrtf(x))
FERRITE_UNARY(rsqrt, rsqrtf(x))
// NaN passes through, as PyTorch's relu (clamp_min) does.
FERRITE_UNARY(relu, (x > 0.0f || x != x) ? x : 0.0f)
FERRITE_UNARY(sigmoid, 1.0f / (1.0f + expf(-x)))
FERRITE_UNARY(tanh, tanhf(x))
FERRITE_UNARY(silu, x / (1.0f + expf(-x)))
// PyTorch's gelu(approximate='none') and 'tanh' (GPT-2's gelu_new).
FERRITE_UNARY(gelu, 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)))
FERRITE_UNARY(gelu_tanh, 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))))
FERRITE_UNARY(abs, fabsf(x))
FERRITE_UNARY(sin, sinf(x))
FERRITE_UNARY(cos, cosf(x))
FERRITE_UNARY(log1p, log1pf(x))
FERRITE_UNARY(reciprocal, 1.0f / x)
FERRITE_UNARY(square, x * x)
// x ** p and leaky_relu (x > 0 ? x : x * p).
FERRITE_UNARY_PARAM(pow_scalar, powf(x, p))
FERRITE_UNARY_PARAM(leaky_relu, x > 0.0f ? x : x * p)

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

// Comparisons with broadcasting: out = (x OP y) as a byte (PyTorch's bool tensors; NaN compares
// false except for `ne`).
#define FERRITE_COMPARE_AS(name, sfx, E, T)                                                      \
    extern "C" __global__ void name##_##sfx(long long n, Broadcast g, const T* __restrict__ a,    \
                                            const T* __restrict__ b, unsigned char* __restrict__ out) { \
        name##_body<E>(n, g, a, b, out);                                                          \
    }
#define FERRITE_COMPARE(name, expr)                                                              \
    template <class E>                                                                            \
    __device__ __forceinline__ void name##_body(long long n, const Broadcast& g, const typename E::T* __restrict__ a, \
                                                const typename E::T* __restrict__ b, unsigned char* __restrict__ out) { \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x) {                                            \
            long long ia, ib;                                                                     \
            offsets(g, i, &ia, &ib);                                                              \
            float x = E::load(a[ia]);                                                             \
            float y = E::load(b[ib]);                                                             \
            out[i] = (expr) ? 1 : 0;                                                              \
        }                                                                                         \
    }                                                                                             \
    FERRITE_COMPARE_AS(name, f32, ElemF32, float)                                                 \
    FERRITE_COMPARE_AS(name, f16, ElemF16, unsigned short)                                        \
    FERRITE_COMPARE_AS(name, bf16, ElemBF16, unsigned short)

FERRITE_COMPARE(eq, x == y)
FERRITE_COMPARE(ne, x != y)
FERRITE_COMPARE(lt, x < y)
FERRITE_COMPARE(le, x <= y)
FERRITE_COMPARE(gt, x > y)
FERRITE_COMPARE(ge, x >= y)

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
template <class E>
__device__ __forceinline__ void clamp_body(long long n, float lo, float hi, const typename E::T* __restrict__ x,
                                           typename E::T* __restrict__ out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = E::load(x[i]);
        if (lo != lo || hi != hi) v = lo != lo ? lo : hi;
        else if (v == v) {
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
        }
        out[i] = E::store(v);
    }
}

#define FERRITE_CLAMP_AS(sfx, E, T)                                                              \
    extern "C" __global__ void clamp_##sfx(long long n, float lo, float hi, const T* __restrict__ x, \
                                           T* __restrict__ out) {                                 \
        clamp_body<E>(n, lo, hi, x, out);                                                         \
    }
FERRITE_CLAMP_AS(f32, ElemF32, float)
FERRITE_CLAMP_AS(f16, ElemF16, unsigned short)
FERRITE_CLAMP_AS(bf16, ElemBF16, unsigned short)
