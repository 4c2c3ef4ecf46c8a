// Batch norm and group norm's per-channel parts (f32) over [N, C, L] buffers (L = H·W, 1 for
// batch_norm1d on [N, C]). Batch norm: one block per channel reduces its N·L values with a fixed
// tree (statistics, then the two sums of backward), one thread per element applies. Group norm
// reuses layer_norm.cu on [N·G, C/G·L] rows (a group's values are contiguous) and adds the
// per-channel affine and its gradients here. PyTorch's rules: training normalises with the biased
// variance and updates the running variance with the unbiased one; eval uses the running
// statistics.

// block_sum and FERRITE_BLOCK come from block_reduce.cuh.

// Per channel: mean and 1/sqrt(var + eps) of the batch; the running statistics (if given) move by
// `momentum` towards the batch mean and the unbiased batch variance.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
batch_norm_stats_f32(long long n, long long c, long long l, const float* __restrict__ x, float eps,
                     float momentum, float* __restrict__ mean_out, float* __restrict__ invstd_out,
                     float* __restrict__ running_mean, float* __restrict__ running_var) {
    __shared__ float shared[FERRITE_BLOCK];
    long long m = n * l;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float s = 0.0f;
        for (long long i = threadIdx.x; i < m; i += FERRITE_BLOCK) s += x[(i / l) * c * l + ch * l + i % l];
        float mean = block_sum(s, shared) / (float)m;
        float v = 0.0f;
        for (long long i = threadIdx.x; i < m; i += FERRITE_BLOCK) {
            float d = x[(i / l) * c * l + ch * l + i % l] - mean;
            v += d * d;
        }
        float var_sum = block_sum(v, shared);
        if (threadIdx.x == 0) {
            mean_out[ch] = mean;
            invstd_out[ch] = rsqrtf(var_sum / (float)m + eps);
            if (running_mean) running_mean[ch] = (1.0f - momentum) * running_mean[ch] + momentum * mean;
            if (running_var) {
                float unbiased = m > 1 ? var_sum / (float)(m - 1) : var_sum;
                running_var[ch] = (1.0f - momentum) * running_var[ch] + momentum * unbiased;
            }
        }
    }
}

// Eval mode's statistics: mean = running_mean, invstd = 1/sqrt(running_var + eps).
extern "C" __global__ void batch_norm_eval_stats_f32(long long c, const float* __restrict__ running_mean,
                                                     const float* __restrict__ running_var, float eps,
                                                     float* __restrict__ mean_out, float* __restrict__ invstd_out) {
    for (long long ch = blockIdx.x * (long long)blockDim.x + threadIdx.x; ch < c;
         ch += (long long)gridDim.x * blockDim.x) {
        mean_out[ch] = running_mean[ch];
        invstd_out[ch] = rsqrtf(running_var[ch] + eps);
    }
}

// y = (x - mean[c]) * invstd[c] * weight[c] + bias[c] (weight/bias may be null).
extern "C" __global__ void batch_norm_apply_f32(long long n, long long c, long long l, const float* __restrict__ x,
                                                const float* __restrict__ mean, const float* __restrict__ invstd,
                                                const float* __restrict__ weight, const float* __restrict__ bias,
                                                float* __restrict__ y) {
    long long total = n * c * l;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ch = (i / l) % c;
        float v = (x[i] - mean[ch]) * invstd[ch];
        if (weight) v *= weight[ch];
        if (bias) v += bias[ch];
        y[i] = v;
    }
}

// Per channel: sum(dy) and sum(dy * xhat) — the bias and weight gradients, and what the input
// gradient needs in training mode.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
batch_norm_backward_reduce_f32(long long n, long long c, long long l, const float* __restrict__ x,
                               const float* __restrict__ dy, const float* __restrict__ mean,
                               const float* __restrict__ invstd, float* __restrict__ sum_dy,
                               float* __restrict__ sum_dy_xhat) {
    __shared__ float shared[FERRITE_BLOCK];
    long long m = n * l;
    for (long long ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float sg = 0.0f, sgx = 0.0f;
        for (long long i = threadIdx.x; i < m; i += FERRITE_BLOCK) {
            long long at = (i / l) * c * l + ch * l + i % l;
            float g = dy[at];
            sg += g;
            sgx += g * (x[at] - mean[ch]) * invstd[ch];
        }
        float a = block_sum(sg, shared);
        float b = block_sum(sgx, shared);
        if (threadIdx.x == 0) {
            sum_dy[ch] = a;
            sum_dy_xhat[ch] = b;
        }
    }
}

// The input gradient. Training: w·invstd·(dy − sum_dy/M − xhat·sum_dy_xhat/M), M = N·L; eval
// (training = 0; mean/invstd are the running statistics): w·invstd·dy.
extern "C" __global__ void batch_norm_backward_input_f32(long long n, long long c, long long l, int training,
                                                         const float* __restrict__ x, const float* __restrict__ dy,
                                                         const float* __restrict__ mean,
                                                         const float* __restrict__ invstd,
                                                         const float* __restrict__ weight,
                                                         const float* __restrict__ sum_dy,
                                                         const float* __restrict__ sum_dy_xhat,
                                                         float* __restrict__ dx) {
    long long total = n * c * l;
    float m = (float)(n * l);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ch = (i / l) % c;
        float k = invstd[ch] * (weight ? weight[ch] : 1.0f);
        if (training) {
            float xhat = (x[i] - mean[ch]) * invstd[ch];
            dx[i] = k * (dy[i] - sum_dy[ch] / m - xhat * sum_dy_xhat[ch] / m);
        } else {
            dx[i] = k * dy[i];
        }
    }
}

// out = x * weight[c] (+ bias[c]) over [N, C, L]: group norm's affine on the normalised values,
// and (bias null) the weighted upstream gradient its input gradient starts from.
extern "C" __global__ void channel_affine_f32(long long n, long long c, long long l, const float* __restrict__ x,
                                              const float* __restrict__ weight, const float* __restrict__ bias,
                                              float* __restrict__ out) {
    long long total = n * c * l;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long ch = (i / l) % c;
        float v = x[i] * (weight ? weight[ch] : 1.0f);
        if (bias) v += bias[ch];
        out[i] = v;
    }
}

// Group norm's weight and bias gradients: per channel, sums over N and L of dy·xhat and dy, with
// xhat from the group statistics (mean/rstd per (n, group), as layer_norm_f32 saved them). One
// thread per channel, in order (deterministic).
extern "C" __global__ void group_norm_backward_affine_f32(long long n, long long c, long long l, long long groups,
                                                          const float* __restrict__ x, const float* __restrict__ mean,
                                                          const float* __restrict__ rstd,
                                                          const float* __restrict__ dy,
                                                          float* __restrict__ dweight, float* __restrict__ dbias) {
    long long per_group = c / groups;
    for (long long ch = blockIdx.x * (long long)blockDim.x + threadIdx.x; ch < c;
         ch += (long long)gridDim.x * blockDim.x) {
        float dw = 0.0f, db = 0.0f;
        for (long long s = 0; s < n; ++s) {
            long long row = s * groups + ch / per_group;
            for (long long j = 0; j < l; ++j) {
                long long at = (s * c + ch) * l + j;
                float g = dy[at];
                dw += g * (x[at] - mean[row]) * rstd[row];
                db += g;
            }
        }
        if (dweight) dweight[ch] = dw;
        if (dbias) dbias[ch] = db;
    }
}
