// The fused multi-tensor kernels of ferrite's FusedKernel (f32), one thread per parameter element:
// the optimizer steps (SGD, Adam/AdamW, RMSprop, Adagrad), the GradScaler's unscale-and-check, a
// vector norm's partial reduction for gradient clipping, and the two clippings. Each step follows
// the CPU backend's sequence of PyTorch ops (backend/cpu/fused/*.rs) with fused multiply-adds
// exactly where PyTorch's kernels use them (add with alpha, lerp, addcmul), so trajectories agree
// with PyTorch's to the last bit or so. The host passes every scalar already derived (−lr,
// 1 − dampening, bias corrections in double), and the flags as bits of `flags`. Every step is
// skipped when `found_inf` is non-null and non-zero (a GradScaler step with an inf gradient).

// Bits of `flags`.
#define FERRITE_OPT_MAXIMIZE 1
#define FERRITE_OPT_WEIGHT_DECAY 2 // SGD/RMSprop/Adagrad: g += wd·p; Adam: the L2 term
#define FERRITE_OPT_NESTEROV 4     // SGD
#define FERRITE_OPT_FIRST_STEP 8   // SGD: the momentum buffer starts as the gradient
#define FERRITE_OPT_DECOUPLED 16   // Adam: AdamW's p *= 1 − lr·wd
#define FERRITE_OPT_LERP_SMALL 32  // Adam/RMSprop: |w| < 0.5 picks lerp's first formula (PyTorch's)

// PyTorch's lerp(s, e, w) with its two branches: s + w (e − s) for |w| < 0.5, else
// e − (e − s)(1 − w).
__device__ __forceinline__ float opt_lerp(float s, float e, float w, float one_minus_w, int small) {
    float d = e - s;
    return small ? fmaf(w, d, s) : fmaf(-d, one_minus_w, e);
}

// The gradient as the step sees it: negated to maximize, plus the L2 term.
__device__ __forceinline__ float opt_grad(float g, float p, float wd, int flags) {
    if (flags & FERRITE_OPT_MAXIMIZE) g = -g;
    if (flags & FERRITE_OPT_WEIGHT_DECAY) g = fmaf(p, wd, g);
    return g;
}

// torch.optim.SGD. momentum_buf is null without momentum; nesterov and first_step come as flags.
extern "C" __global__ void sgd_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                        float* __restrict__ momentum_buf, float neg_lr, float momentum,
                                        float one_minus_dampening, float weight_decay, int flags,
                                        const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = opt_grad(grad[i], p, weight_decay, flags);
        if (momentum_buf) {
            float b = (flags & FERRITE_OPT_FIRST_STEP) ? g : fmaf(g, one_minus_dampening, momentum_buf[i] * momentum);
            momentum_buf[i] = b;
            g = (flags & FERRITE_OPT_NESTEROV) ? fmaf(b, momentum, g) : b;
        }
        param[i] = fmaf(g, neg_lr, p);
    }
}

// torch.optim.Adam / AdamW. max_exp_avg_sq is null without amsgrad. w1 = 1 − beta1 and
// one_minus_w1 = 1 − w1 (both rounded to f32 on the host), c2 = 1 − beta2, step_size = lr /
// (1 − beta1^step), bias_correction2_sqrt = sqrt(1 − beta2^step); decay = 1 − lr·wd (AdamW).
extern "C" __global__ void adam_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                         float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq,
                                         float* __restrict__ max_exp_avg_sq, float l2, float decay, float w1,
                                         float one_minus_w1, float beta2, float c2, float bias_correction2_sqrt,
                                         float eps, float neg_step_size, int flags,
                                         const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    int small = flags & FERRITE_OPT_LERP_SMALL;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float p = param[i];
        if (flags & FERRITE_OPT_DECOUPLED) p = p * decay;
        float g = opt_grad(grad[i], p, l2, flags);
        float m = opt_lerp(exp_avg[i], g, w1, one_minus_w1, small);
        float v = fmaf(c2 * g, g, exp_avg_sq[i] * beta2);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        if (max_exp_avg_sq) {
            float old = max_exp_avg_sq[i];
            float mx = (isnan(old) || isnan(v)) ? __int_as_float(0x7fc00000) : (v > old ? v : old);
            max_exp_avg_sq[i] = mx;
            v = mx;
        }
        float denom = sqrtf(v) / bias_correction2_sqrt + eps;
        param[i] = p + (neg_step_size * m) / denom;
    }
}

// torch.optim.RMSprop. momentum_buf is null without momentum, grad_avg null unless centered;
// w = 1 − alpha and one_minus_w = 1 − w (f32, from the host).
extern "C" __global__ void rmsprop_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                            float* __restrict__ square_avg, float* __restrict__ momentum_buf,
                                            float* __restrict__ grad_avg, float neg_lr, float alpha, float w,
                                            float one_minus_w, float eps, float weight_decay, float momentum,
                                            int flags, const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    int small = flags & FERRITE_OPT_LERP_SMALL;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = opt_grad(grad[i], p, weight_decay, flags);
        float sq = fmaf(w * g, g, square_avg[i] * alpha);
        square_avg[i] = sq;
        float v = sq;
        if (grad_avg) {
            float m = opt_lerp(grad_avg[i], g, w, one_minus_w, small);
            grad_avg[i] = m;
            v = fmaf(-m, m, sq);
        }
        float avg = sqrtf(v) + eps;
        if (momentum_buf) {
            float b = momentum_buf[i] * momentum + g / avg;
            momentum_buf[i] = b;
            param[i] = fmaf(b, neg_lr, p);
        } else {
            param[i] = p + (neg_lr * g) / avg;
        }
    }
}

// torch.optim.Adagrad: state_sum += g², param += −clr · g / (sqrt(state_sum) + eps), with clr =
// lr / (1 + (step − 1)·lr_decay) computed on the host in double.
extern "C" __global__ void adagrad_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                            float* __restrict__ state_sum, float neg_clr, float eps,
                                            float weight_decay, int flags, const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float p = param[i];
        float g = opt_grad(grad[i], p, weight_decay, flags);
        float s = fmaf(g, g, state_sum[i]);
        state_sum[i] = s;
        param[i] = p + (neg_clr * g) / (sqrtf(s) + eps);
    }
}

// GradScaler (PyTorch's _amp_foreach_non_finite_check_and_unscale_): *found_inf = 1 if any
// gradient is inf or NaN, and grads *= inv_scale unless inv_scale is 1.
extern "C" __global__ void unscale_and_check_f32(long long n, float* __restrict__ grad, float inv_scale,
                                                 float* __restrict__ found_inf) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i];
        if (!isfinite(g)) *found_inf = 1.0f;
        if (inv_scale != 1.0f) grad[i] = g * inv_scale;
    }
}

// The norm kinds of norm_partial_f32 (NormKind on the host).
#define FERRITE_NORM_INF 0
#define FERRITE_NORM_NEG_INF 1
#define FERRITE_NORM_ZERO 2
#define FERRITE_NORM_ONE 3
#define FERRITE_NORM_TWO 4
#define FERRITE_NORM_P 5

__device__ __forceinline__ double norm_elem(int kind, double x, double p) {
    switch (kind) {
    case FERRITE_NORM_ZERO: return x != 0.0 ? 1.0 : 0.0;
    case FERRITE_NORM_TWO: return x * x;
    case FERRITE_NORM_P: return pow(fabs(x), p);
    default: return fabs(x);
    }
}

// NaN-propagating max/min (NaN wins, as torch.linalg.vector_norm) and the plain sum.
__device__ __forceinline__ double norm_combine(int kind, double a, double b) {
    if (kind == FERRITE_NORM_INF || kind == FERRITE_NORM_NEG_INF) {
        if (isnan(a) || isnan(b)) return a + b;
        if (kind == FERRITE_NORM_INF) return a > b ? a : b;
        return a < b ? a : b;
    }
    return a + b;
}

// A vector norm's partial reduction for gradient clipping, in double: block b of a
// FERRITE_BLOCK-wide launch writes the reduction of its grid-stride elements (a fixed tree) to
// partials[b]; the host combines the partials in order and finishes the norm, so the result
// depends only on n and the grid, never on timing. identity: 0, or +inf for NEG_INF.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
norm_partial_f32(long long n, const float* __restrict__ x, int kind, double p, double identity,
                 double* __restrict__ partials) {
    __shared__ double shared[FERRITE_BLOCK];
    double acc = identity;
    for (long long i = blockIdx.x * (long long)FERRITE_BLOCK + threadIdx.x; i < n;
         i += (long long)gridDim.x * FERRITE_BLOCK) {
        acc = norm_combine(kind, acc, norm_elem(kind, (double)x[i], p));
    }
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int s = FERRITE_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] = norm_combine(kind, shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// clip_grad_value_: clamp_(−clip, clip), NaN stays NaN.
extern "C" __global__ void clamp_abs_f32(long long n, float* __restrict__ x, float clip) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float a = x[i];
        if (a > clip) x[i] = clip;
        else if (a < -clip) x[i] = -clip;
    }
}

// clip_grad_norm_'s mul_(coef), the coefficient already rounded to the element type on the host.
extern "C" __global__ void scale_f32(long long n, float* __restrict__ x, float coef) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = x[i] * coef;
    }
}
