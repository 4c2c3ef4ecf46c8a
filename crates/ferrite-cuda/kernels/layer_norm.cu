// Layer norm and RMS norm over the last dimension (f32), one block per row, with the per-row
// statistics saved for backward as PyTorch saves them (mean and rstd; rstd alone for RMS norm).
// Sums use a fixed tree, so results do not depend on timing.

// block_sum and FERRITE_BLOCK come from block_reduce.cuh.

// y = (x - mean) * rstd * weight + bias; weight/bias may be null (elementwise_affine=False).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
layer_norm_f32(long long rows, long long cols, float eps, const float* __restrict__ x,
               const float* __restrict__ weight, const float* __restrict__ bias, float* __restrict__ y,
               float* __restrict__ mean_out, float* __restrict__ rstd_out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float s = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) s += xr[c];
        float mean = block_sum(s, shared) / (float)cols;
        float v = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float d = xr[c] - mean;
            v += d * d;
        }
        float rstd = rsqrtf(block_sum(v, shared) / (float)cols + eps);
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float n = (xr[c] - mean) * rstd;
            if (weight) n *= weight[c];
            if (bias) n += bias[c];
            y[r * cols + c] = n;
        }
        if (threadIdx.x == 0) {
            mean_out[r] = mean;
            rstd_out[r] = rstd;
        }
    }
}

// Gradient of the input: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
layer_norm_backward_input_f32(long long rows, long long cols, const float* __restrict__ x,
                              const float* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, const float* __restrict__ dy,
                              float* __restrict__ dx) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        const float* gr = dy + r * cols;
        float m = mean[r], rs = rstd[r];
        float sg = 0.0f, sgx = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float g = gr[c] * (weight ? weight[c] : 1.0f);
            float xhat = (xr[c] - m) * rs;
            sg += g;
            sgx += g * xhat;
        }
        float mg = block_sum(sg, shared) / (float)cols;
        float mgx = block_sum(sgx, shared) / (float)cols;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float g = gr[c] * (weight ? weight[c] : 1.0f);
            float xhat = (xr[c] - m) * rs;
            dx[r * cols + c] = rs * (g - mg - xhat * mgx);
        }
    }
}

// Gradients of weight and bias: column sums over rows of dy * xhat and dy, one thread per column
// walking the rows in order (deterministic; no atomics).
extern "C" __global__ void layer_norm_backward_affine_f32(long long rows, long long cols,
                                                          const float* __restrict__ x,
                                                          const float* __restrict__ mean,
                                                          const float* __restrict__ rstd,
                                                          const float* __restrict__ dy,
                                                          float* __restrict__ dweight,
                                                          float* __restrict__ dbias) {
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < cols;
         c += (long long)gridDim.x * blockDim.x) {
        float dw = 0.0f, db = 0.0f;
        for (long long r = 0; r < rows; ++r) {
            float g = dy[r * cols + c];
            dw += g * (x[r * cols + c] - mean[r]) * rstd[r];
            db += g;
        }
        if (dweight) dweight[c] = dw;
        if (dbias) dbias[c] = db;
    }
}

// RMS norm (Llama, T5): y = x * rsqrt(mean(x^2) + eps) * weight.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
rms_norm_f32(long long rows, long long cols, float eps, const float* __restrict__ x,
             const float* __restrict__ weight, float* __restrict__ y, float* __restrict__ rstd_out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float s = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) s += xr[c] * xr[c];
        float rstd = rsqrtf(block_sum(s, shared) / (float)cols + eps);
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            y[r * cols + c] = xr[c] * rstd * (weight ? weight[c] : 1.0f);
        }
        if (threadIdx.x == 0) rstd_out[r] = rstd;
    }
}

// Gradient of RMS norm's input: with xhat = x * rstd and g = dy * weight,
// dx = rstd * (g - xhat * mean(g * xhat)).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
rms_norm_backward_input_f32(long long rows, long long cols, const float* __restrict__ x,
                            const float* __restrict__ weight, const float* __restrict__ rstd,
                            const float* __restrict__ dy, float* __restrict__ dx) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        const float* gr = dy + r * cols;
        float rs = rstd[r];
        float sgx = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float g = gr[c] * (weight ? weight[c] : 1.0f);
            sgx += g * xr[c] * rs;
        }
        float mgx = block_sum(sgx, shared) / (float)cols;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float g = gr[c] * (weight ? weight[c] : 1.0f);
            dx[r * cols + c] = rs * (g - xr[c] * rs * mgx);
        }
    }
}

// Gradient of RMS norm's weight: column sums over rows of dy * x * rstd, rows in order.
extern "C" __global__ void rms_norm_backward_weight_f32(long long rows, long long cols, const float* __restrict__ x,
                                                        const float* __restrict__ rstd, const float* __restrict__ dy,
                                                        float* __restrict__ dweight) {
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < cols;
         c += (long long)gridDim.x * blockDim.x) {
        float dw = 0.0f;
        for (long long r = 0; r < rows; ++r) dw += dy[r * cols + c] * x[r * cols + c] * rstd[r];
        dweight[c] = dw;
    }
}
