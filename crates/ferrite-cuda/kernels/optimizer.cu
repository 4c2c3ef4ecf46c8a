// Fused optimizer and loss-scaling kernels (f32), one thread per parameter element.

// GradScaler: grads *= inv_scale, and *found_inf = 1 if any result is inf or NaN (PyTorch's
// _amp_foreach_non_finite_check_and_unscale_).
extern "C" __global__ void unscale_and_check_f32(long long n, float* __restrict__ grad, float inv_scale,
                                                 float* __restrict__ found_inf) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] * inv_scale;
        grad[i] = g;
        if (!isfinite(g)) *found_inf = 1.0f;
    }
}

// AdamW (PyTorch's torch.optim.AdamW, amsgrad=False): decoupled weight decay, then the moments,
// bias-corrected step. bias_correction1 = 1 - beta1^step, bias_correction2_sqrt = sqrt(1 - beta2^step),
// computed on the host in double as PyTorch does. Skipped entirely when *found_inf != 0.
extern "C" __global__ void adamw_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                          float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, float lr,
                                          float beta1, float beta2, float eps, float weight_decay,
                                          float bias_correction1, float bias_correction2_sqrt,
                                          const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    float step_size = lr / bias_correction1;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float p = param[i] * (1.0f - lr * weight_decay);
        float g = grad[i];
        float m = exp_avg[i] + (g - exp_avg[i]) * (1.0f - beta1);
        float v = exp_avg_sq[i] * beta2 + g * g * (1.0f - beta2);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        float denom = sqrtf(v) / bias_correction2_sqrt + eps;
        param[i] = p - step_size * m / denom;
    }
}

// SGD with momentum and dampening (PyTorch's torch.optim.SGD, nesterov optional). The first step
// copies the gradient into the buffer (first_step != 0), as PyTorch does.
extern "C" __global__ void sgd_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                        float* __restrict__ momentum_buf, float lr, float momentum,
                                        float dampening, float weight_decay, int nesterov, int first_step,
                                        const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] + weight_decay * param[i];
        if (momentum != 0.0f) {
            float b = first_step ? g : momentum_buf[i] * momentum + (1.0f - dampening) * g;
            momentum_buf[i] = b;
            g = nesterov ? g + momentum * b : b;
        }
        param[i] -= lr * g;
    }
}

// RMSprop (PyTorch's torch.optim.RMSprop): square_avg = alpha·square_avg + (1 − alpha)·g²; centered
// subtracts grad_avg² under the root; with momentum, buf = momentum·buf + g / avg and the step is
// lr·buf. grad_avg and momentum_buf are null when not used. Skipped when *found_inf != 0.
extern "C" __global__ void rmsprop_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                            float* __restrict__ square_avg, float* __restrict__ grad_avg,
                                            float* __restrict__ momentum_buf, float lr, float alpha, float eps,
                                            float weight_decay, float momentum, const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] + weight_decay * param[i];
        float sq = alpha * square_avg[i] + (1.0f - alpha) * g * g;
        square_avg[i] = sq;
        float avg;
        if (grad_avg) {
            float ga = alpha * grad_avg[i] + (1.0f - alpha) * g;
            grad_avg[i] = ga;
            avg = sqrtf(sq - ga * ga) + eps;
        } else {
            avg = sqrtf(sq) + eps;
        }
        if (momentum_buf) {
            float b = momentum * momentum_buf[i] + g / avg;
            momentum_buf[i] = b;
            param[i] -= lr * b;
        } else {
            param[i] -= lr * g / avg;
        }
    }
}

// Adagrad (PyTorch's torch.optim.Adagrad): state_sum += g², param −= clr · g / (sqrt(state_sum) +
// eps), with clr = lr / (1 + (step − 1)·lr_decay) computed on the host in double.
extern "C" __global__ void adagrad_step_f32(long long n, float* __restrict__ param, const float* __restrict__ grad,
                                            float* __restrict__ state_sum, float clr, float eps, float weight_decay,
                                            const float* __restrict__ found_inf) {
    if (found_inf && *found_inf != 0.0f) return;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float g = grad[i] + weight_decay * param[i];
        float s = state_sum[i] + g * g;
        state_sum[i] = s;
        param[i] -= clr * g / (sqrtf(s) + eps);
    }
}

// Partial sums of squares for gradient clipping's total norm: block b of a FERRITE_BLOCK-wide
// launch writes the sum over its grid-stride elements (block_sum's fixed tree) to partials[b]; the
// host adds the partials in order, so the norm depends only on n and the grid, never on timing.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
sum_squares_partial_f32(long long n, const float* __restrict__ x, float* __restrict__ partials) {
    __shared__ float shared[FERRITE_BLOCK];
    float acc = 0.0f;
    for (long long i = blockIdx.x * (long long)FERRITE_BLOCK + threadIdx.x; i < n;
         i += (long long)gridDim.x * FERRITE_BLOCK) {
        acc += x[i] * x[i];
    }
    float total = block_sum(acc, shared);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}
