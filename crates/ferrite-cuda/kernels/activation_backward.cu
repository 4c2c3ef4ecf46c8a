// Gradients of the unary activations, one thread per element, grid-stride loop: dx from the
// upstream gradient dy and the forward's input x or output y, whichever PyTorch's backward uses
// (relu/silu/gelu read x; sigmoid and tanh read y, which the forward saved). Each kernel exists for
// f32, f16 and bf16 (names ending _f32, _f16, _bf16; half.cuh's element types): half operands are
// loaded into f32 and the gradient rounded once on store, as the CPU backend computes it.

#define FERRITE_ACT_BACKWARD_AS(name, sfx, E, T)                                                 \
    extern "C" __global__ void name##_##sfx(long long n, const T* __restrict__ saved, const T* __restrict__ dy, \
                                            T* __restrict__ dx) {                                  \
        name##_body<E>(n, saved, dy, dx);                                                          \
    }
#define FERRITE_ACT_BACKWARD(name, expr)                                                          \
    template <class E>                                                                             \
    __device__ __forceinline__ void name##_body(long long n, const typename E::T* __restrict__ saved, \
                                                const typename E::T* __restrict__ dy,              \
                                                typename E::T* __restrict__ dx) {                  \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;               \
             i += (long long)gridDim.x * blockDim.x) {                                             \
            float s = E::load(saved[i]);                                                           \
            float g = E::load(dy[i]);                                                              \
            dx[i] = E::store(expr);                                                                \
        }                                                                                          \
    }                                                                                              \
    FERRITE_ACT_BACKWARD_AS(name, f32, ElemF32, float)                                             \
    FERRITE_ACT_BACKWARD_AS(name, f16, ElemF16, unsigned short)                                    \
    FERRITE_ACT_BACKWARD_AS(name, bf16, ElemBF16, unsigned short)

// threshold_backward(dy, x, 0): the gradient passes where x > 0.
FERRITE_ACT_BACKWARD(relu_backward, s > 0.0f ? g : 0.0f)
// From the output y: y (1 - y), and 1 - y^2.
FERRITE_ACT_BACKWARD(sigmoid_backward, g * s * (1.0f - s))
FERRITE_ACT_BACKWARD(tanh_backward, g * (1.0f - s * s))
// silu(x) = x sigmoid(x): sigmoid(x) (1 + x (1 - sigmoid(x))).
FERRITE_ACT_BACKWARD(silu_backward,
                     g * (1.0f / (1.0f + expf(-s))) * (1.0f + s * (1.0f - 1.0f / (1.0f + expf(-s)))))
// gelu (erf): Phi(x) + x phi(x), phi the standard normal density (1/sqrt(2 pi) = 0.3989...).
FERRITE_ACT_BACKWARD(gelu_backward,
                     g * (0.5f * (1.0f + erff(s * 0.70710678118654752f)) +
                          s * 0.39894228040143268f * expf(-0.5f * s * s)))
// gelu (tanh): with u = sqrt(2/pi) (x + 0.044715 x^3) and t = tanh(u),
// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
FERRITE_ACT_BACKWARD(gelu_tanh_backward,
                     g * (0.5f * (1.0f + tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s))) +
                          0.5f * s *
                              (1.0f - tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s)) *
                                          tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s))) *
                              0.79788456080286536f * (1.0f + 0.134145f * s * s)))

// The other unary gradients in one kernel, the op as a number (`UnaryGrad` of ferrite-tensor's
// cuda backend keeps this order): dx = dy * f'(s), `s` the forward's output for exp, sqrt, rsqrt
// and reciprocal and its input otherwise (what the CPU backend's derivative reads), `p` the op's
// scalar (pow's exponent, leaky_relu's slope).
template <class E>
__device__ __forceinline__ void unary_grad_body(long long n, int op, float p, const typename E::T* __restrict__ saved,
                                                const typename E::T* __restrict__ dy, typename E::T* __restrict__ dx) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float s = E::load(saved[i]);
        float d;
        switch (op) {
            case 0: d = s; break;                                           // exp (y)
            case 1: d = 1.0f / s; break;                                    // log
            case 2: d = 0.5f / s; break;                                    // sqrt (y)
            case 3: d = -0.5f * s * s * s; break;                           // rsqrt (y)
            case 4: d = -1.0f; break;                                       // neg
            case 5: d = s > 0.0f ? 1.0f : (s < 0.0f ? -1.0f : 0.0f); break; // abs
            case 6: d = cosf(s); break;                                     // sin
            case 7: d = -sinf(s); break;                                    // cos
            case 8: d = 1.0f / (1.0f + s); break;                           // log1p
            case 9: d = -(s * s); break;                                    // reciprocal (y)
            case 10: d = 2.0f * s; break;                                   // square
            case 11: d = p == 0.0f ? 0.0f : p * powf(s, p - 1.0f); break;   // pow
            case 12: d = s > 0.0f ? 1.0f : p; break;                        // leaky_relu
            default: d = 0.0f;
        }
        dx[i] = E::store(E::load(dy[i]) * d);
    }
}

#define FERRITE_UNARY_GRAD_AS(sfx, E, T)                                                          \
    extern "C" __global__ void unary_grad_##sfx(long long n, int op, float p, const T* __restrict__ saved, \
                                                const T* __restrict__ dy, T* __restrict__ dx) {    \
        unary_grad_body<E>(n, op, p, saved, dy, dx);                                               \
    }
FERRITE_UNARY_GRAD_AS(f32, ElemF32, float)
FERRITE_UNARY_GRAD_AS(f16, ElemF16, unsigned short)
FERRITE_UNARY_GRAD_AS(bf16, ElemBF16, unsigned short)
