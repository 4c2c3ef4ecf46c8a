// Gradients of the unary activations (f32), one thread per element, grid-stride loop: dx from the
// upstream gradient dy and the forward's input x or output y, whichever PyTorch's backward uses
// (relu/silu/gelu read x; sigmoid and tanh read y, which the forward saved).

#define FERRITE_ACT_BACKWARD(name, expr)                                                        \
    extern "C" __global__ void name(long long n, const float* __restrict__ saved,                \
                                    const float* __restrict__ dy, float* __restrict__ dx) {      \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;             \
             i += (long long)gridDim.x * blockDim.x) {                                           \
            float s = saved[i];                                                                  \
            float g = dy[i];                                                                     \
            dx[i] = (expr);                                                                      \
        }                                                                                        \
    }

// threshold_backward(dy, x, 0): the gradient passes where x > 0.
FERRITE_ACT_BACKWARD(relu_backward_f32, s > 0.0f ? g : 0.0f)
// From the output y: y (1 - y), and 1 - y^2.
FERRITE_ACT_BACKWARD(sigmoid_backward_f32, g * s * (1.0f - s))
FERRITE_ACT_BACKWARD(tanh_backward_f32, g * (1.0f - s * s))
// silu(x) = x sigmoid(x): sigmoid(x) (1 + x (1 - sigmoid(x))).
FERRITE_ACT_BACKWARD(silu_backward_f32,
                     g * (1.0f / (1.0f + expf(-s))) * (1.0f + s * (1.0f - 1.0f / (1.0f + expf(-s)))))
// gelu (erf): Phi(x) + x phi(x), phi the standard normal density (1/sqrt(2 pi) = 0.3989...).
FERRITE_ACT_BACKWARD(gelu_backward_f32,
                     g * (0.5f * (1.0f + erff(s * 0.70710678118654752f)) +
                          s * 0.39894228040143268f * expf(-0.5f * s * s)))
// gelu (tanh): with u = sqrt(2/pi) (x + 0.044715 x^3) and t = tanh(u),
// 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
FERRITE_ACT_BACKWARD(gelu_tanh_backward_f32,
                     g * (0.5f * (1.0f + tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s))) +
                          0.5f * s *
                              (1.0f - tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s)) *
                                          tanhf(0.79788456080286536f * (s + 0.044715f * s * s * s))) *
                              0.79788456080286536f * (1.0f + 0.134145f * s * s)))

// The other unary gradients in one kernel, the op as a number (`UnaryGrad` of ferrite-tensor's
// cuda backend keeps this order): dx = dy * f'(s), `s` the forward's output for exp, sqrt, rsqrt
// and reciprocal and its input otherwise (what the CPU backend's derivative reads), `p` the op's
// scalar (pow's exponent, leaky_relu's slope).
extern "C" __global__ void unary_grad_f32(long long n, int op, float p, const float* __restrict__ saved,
                                          const float* __restrict__ dy, float* __restrict__ dx) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float s = saved[i];
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
        dx[i] = dy[i] * d;
    }
}
