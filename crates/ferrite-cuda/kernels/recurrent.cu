// The elementwise halves of the LSTM and GRU cells (f32), fused as cuDNN and PyTorch's fused cells
// do: the matrix products (the input projection of every step at once, the hidden projection of
// each step) are cuBLAS's; these kernels turn the two projections into the new state in one pass,
// and back. One thread per (batch row, hidden unit). Gate orders are PyTorch's (LSTM i, f, g, o;
// GRU r, z, n). Rows of the projections and of h may be strided (a step of a batch-first
// sequence); a null previous state is zero.

__device__ __forceinline__ float rnn_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// gx, gh: [batch, 4H] projections with their biases. Saves the activated gates (act: [batch, 4H])
// for backward.
extern "C" __global__ void lstm_cell_f32(long long batch, long long hidden, const float* __restrict__ gx,
                                         long long gx_stride, const float* __restrict__ gh,
                                         const float* __restrict__ c_prev, float* __restrict__ h_out,
                                         long long h_stride, float* __restrict__ c_out, float* __restrict__ act) {
    long long total = batch * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        const float* x = gx + b * gx_stride;
        const float* hh = gh + b * 4 * hidden;
        float i = rnn_sigmoid(x[j] + hh[j]);
        float f = rnn_sigmoid(x[hidden + j] + hh[hidden + j]);
        float g = tanhf(x[2 * hidden + j] + hh[2 * hidden + j]);
        float o = rnn_sigmoid(x[3 * hidden + j] + hh[3 * hidden + j]);
        float cp = c_prev ? c_prev[t] : 0.0f;
        float c = f * cp + i * g;
        c_out[t] = c;
        h_out[b * h_stride + j] = o * tanhf(c);
        float* a = act + b * 4 * hidden;
        a[j] = i;
        a[hidden + j] = f;
        a[2 * hidden + j] = g;
        a[3 * hidden + j] = o;
    }
}

// From dh (the step's output gradient plus the next step's hidden gradient) and dc_next: the
// gradient of both projections (dgates: [batch, 4H], pre-activation) and dc_prev.
extern "C" __global__ void lstm_cell_backward_f32(long long batch, long long hidden, const float* __restrict__ act,
                                                  const float* __restrict__ c_prev, const float* __restrict__ c,
                                                  const float* __restrict__ dh, long long dh_stride,
                                                  const float* __restrict__ dc_next, float* __restrict__ dgates,
                                                  float* __restrict__ dc_prev) {
    long long total = batch * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        const float* a = act + b * 4 * hidden;
        float i = a[j], f = a[hidden + j], g = a[2 * hidden + j], o = a[3 * hidden + j];
        float tc = tanhf(c[t]);
        float gh = dh[b * dh_stride + j];
        float dc = (dc_next ? dc_next[t] : 0.0f) + gh * o * (1.0f - tc * tc);
        float cp = c_prev ? c_prev[t] : 0.0f;
        float* d = dgates + b * 4 * hidden;
        d[j] = dc * g * i * (1.0f - i);
        d[hidden + j] = dc * cp * f * (1.0f - f);
        d[2 * hidden + j] = dc * i * (1.0f - g * g);
        d[3 * hidden + j] = gh * tc * o * (1.0f - o);
        dc_prev[t] = dc * f;
    }
}

// gx, gh: [batch, 3H] projections with their biases (b_hn stays inside r's product, as in
// PyTorch). Saves r, z, n and the hidden projection of n (act: [batch, 4H]).
extern "C" __global__ void gru_cell_f32(long long batch, long long hidden, const float* __restrict__ gx,
                                        long long gx_stride, const float* __restrict__ gh,
                                        const float* __restrict__ h_prev, float* __restrict__ h_out,
                                        long long h_stride, float* __restrict__ act) {
    long long total = batch * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        const float* x = gx + b * gx_stride;
        const float* hh = gh + b * 3 * hidden;
        float r = rnn_sigmoid(x[j] + hh[j]);
        float z = rnn_sigmoid(x[hidden + j] + hh[hidden + j]);
        float hn = hh[2 * hidden + j];
        float n = tanhf(x[2 * hidden + j] + r * hn);
        float hp = h_prev ? h_prev[t] : 0.0f;
        h_out[b * h_stride + j] = (1.0f - z) * n + z * hp;
        float* a = act + b * 4 * hidden;
        a[j] = r;
        a[hidden + j] = z;
        a[2 * hidden + j] = n;
        a[3 * hidden + j] = hn;
    }
}

// From dh: the gradients of the input projection (dgx), of the hidden projection (dgh) and the
// direct part of dh_prev (z · dh; the rest is dgh · W_hh, a product).
extern "C" __global__ void gru_cell_backward_f32(long long batch, long long hidden, const float* __restrict__ act,
                                                 const float* __restrict__ h_prev, const float* __restrict__ dh,
                                                 long long dh_stride, float* __restrict__ dgx, float* __restrict__ dgh,
                                                 float* __restrict__ dh_prev) {
    long long total = batch * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        const float* a = act + b * 4 * hidden;
        float r = a[j], z = a[hidden + j], n = a[2 * hidden + j], hn = a[3 * hidden + j];
        float g = dh[b * dh_stride + j];
        float hp = h_prev ? h_prev[t] : 0.0f;
        float dn = g * (1.0f - z) * (1.0f - n * n);
        float dz = g * (hp - n) * z * (1.0f - z);
        float dr = dn * hn * r * (1.0f - r);
        float* x = dgx + b * 3 * hidden;
        float* h = dgh + b * 3 * hidden;
        x[j] = dr;
        x[hidden + j] = dz;
        x[2 * hidden + j] = dn;
        h[j] = dr;
        h[hidden + j] = dz;
        h[2 * hidden + j] = dn * r;
        dh_prev[t] = g * z;
    }
}
