// The pointwise step of the recurrent cells (f32) and its gradient, fused as cuDNN and PyTorch's
// fused cells do: the matrix products (the input projection of every step at once, the hidden
// projection of each step) are cuBLAS's; these kernels turn the two projections and the biases
// into the new state in one pass, and back. One thread per (row, hidden unit). Gate orders are
// PyTorch's (LSTM i, f, g, o; GRU r, z, n). Every [rows, k·hidden] operand is a row block: unit
// stride along its columns and its own distance between rows (`*_rs`), so a step of a
// batch-first sequence needs no copy. Sums follow PyTorch's order, (W_ih x + b_ih) +
// (W_hh h + b_hh), and the GRU's update is ATen's n + z (h − n), as in the CPU backend
// (backend/cpu/recurrent.rs). Biases ([G·hidden], contiguous) and optional operands may be null
// (zero).

__device__ __forceinline__ float rnn_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// (gi + b_ih) + (gh + b_hh) of column `col` of row `b`.
__device__ __forceinline__ float rnn_pre(const float* gi, long long gi_rs, const float* gh, long long gh_rs,
                                         const float* b_ih, const float* b_hh, long long b, long long col) {
    float x = gi[b * gi_rs + col] + (b_ih ? b_ih[col] : 0.0f);
    float h = gh[b * gh_rs + col] + (b_hh ? b_hh[col] : 0.0f);
    return x + h;
}

// LSTM: c' = σ(f) c + σ(i) tanh(g), h' = σ(o) tanh(c'); saves the activated i, f, g, o
// (saved: [rows, 4H]).
extern "C" __global__ void lstm_cell_f32(long long rows, long long hidden, const float* __restrict__ gi,
                                         long long gi_rs, const float* __restrict__ gh, long long gh_rs,
                                         const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                         const float* __restrict__ c_prev, long long cp_rs, float* __restrict__ h,
                                         long long h_rs, float* __restrict__ c, long long c_rs,
                                         float* __restrict__ saved, long long sv_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float i = rnn_sigmoid(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, j));
        float f = rnn_sigmoid(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, hidden + j));
        float g = tanhf(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, 2 * hidden + j));
        float o = rnn_sigmoid(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, 3 * hidden + j));
        float cn = f * c_prev[b * cp_rs + j] + i * g;
        c[b * c_rs + j] = cn;
        h[b * h_rs + j] = o * tanhf(cn);
        float* s = saved + b * sv_rs;
        s[j] = i;
        s[hidden + j] = f;
        s[2 * hidden + j] = g;
        s[3 * hidden + j] = o;
    }
}

// GRU: r = σ(.), z = σ(.), n = tanh((x_n + b_in) + r (W_hn h + b_hn)), h' = n + z (h − n); saves
// r, z, n and W_hn h + b_hn (saved: [rows, 4H]).
extern "C" __global__ void gru_cell_f32(long long rows, long long hidden, const float* __restrict__ gi,
                                        long long gi_rs, const float* __restrict__ gh, long long gh_rs,
                                        const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                        const float* __restrict__ h_prev, long long hp_rs, float* __restrict__ h,
                                        long long h_rs, float* __restrict__ saved, long long sv_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float r = rnn_sigmoid(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, j));
        float z = rnn_sigmoid(rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, hidden + j));
        long long cn = 2 * hidden + j;
        float hn = gh[b * gh_rs + cn] + (b_hh ? b_hh[cn] : 0.0f);
        float n = tanhf((gi[b * gi_rs + cn] + (b_ih ? b_ih[cn] : 0.0f)) + r * hn);
        h[b * h_rs + j] = n + z * (h_prev[b * hp_rs + j] - n);
        float* s = saved + b * sv_rs;
        s[j] = r;
        s[hidden + j] = z;
        s[2 * hidden + j] = n;
        s[3 * hidden + j] = hn;
    }
}

// The plain RNN: h' = tanh(pre), or relu(pre) with relu != 0 (NaN stays NaN, as clamp_min).
extern "C" __global__ void rnn_cell_f32(long long rows, long long hidden, int relu, const float* __restrict__ gi,
                                        long long gi_rs, const float* __restrict__ gh, long long gh_rs,
                                        const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                        float* __restrict__ h, long long h_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float p = rnn_pre(gi, gi_rs, gh, gh_rs, b_ih, b_hh, b, j);
        h[b * h_rs + j] = relu ? (p < 0.0f ? 0.0f : p) : tanhf(p);
    }
}

// dh + dh_out at (b, j) (dh_out may be null).
__device__ __forceinline__ float rnn_total(const float* dh, long long dh_rs, const float* dh_out, long long dho_rs,
                                           long long b, long long j) {
    float d = dh[b * dh_rs + j];
    return dh_out ? d + dh_out[b * dho_rs + j] : d;
}

// LSTM backward: from dh (+ dh_out) and dc (null: zero), the gradients of the four
// pre-activations (dgi: [rows, 4H]) and dc_prev = dc_total · f.
extern "C" __global__ void lstm_cell_backward_f32(long long rows, long long hidden, const float* __restrict__ dh,
                                                  long long dh_rs, const float* __restrict__ dh_out, long long dho_rs,
                                                  const float* __restrict__ dc, long long dc_rs,
                                                  const float* __restrict__ saved, long long sv_rs,
                                                  const float* __restrict__ c, long long c_rs,
                                                  const float* __restrict__ c_prev, long long cp_rs,
                                                  float* __restrict__ dgi, long long dgi_rs,
                                                  float* __restrict__ dc_prev, long long dcp_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float d = rnn_total(dh, dh_rs, dh_out, dho_rs, b, j);
        const float* s = saved + b * sv_rs;
        float i = s[j], f = s[hidden + j], g = s[2 * hidden + j], o = s[3 * hidden + j];
        float tc = tanhf(c[b * c_rs + j]);
        float dct = (dc ? dc[b * dc_rs + j] : 0.0f) + d * o * (1.0f - tc * tc);
        float* out = dgi + b * dgi_rs;
        out[j] = dct * g * i * (1.0f - i);
        out[hidden + j] = dct * c_prev[b * cp_rs + j] * f * (1.0f - f);
        out[2 * hidden + j] = dct * i * (1.0f - g * g);
        out[3 * hidden + j] = d * tc * o * (1.0f - o);
        dc_prev[b * dcp_rs + j] = dct * f;
    }
}

// GRU backward: the gradients of the input projection (dgi) and of the hidden projection (dgh,
// which differs in the n gate: r · dn), and the direct part of dh_prev (dh · z; the rest is
// dgh · W_hh, a product).
extern "C" __global__ void gru_cell_backward_f32(long long rows, long long hidden, const float* __restrict__ dh,
                                                 long long dh_rs, const float* __restrict__ dh_out, long long dho_rs,
                                                 const float* __restrict__ saved, long long sv_rs,
                                                 const float* __restrict__ h_prev, long long hp_rs,
                                                 float* __restrict__ dgi, long long dgi_rs, float* __restrict__ dgh,
                                                 long long dgh_rs, float* __restrict__ dh_prev, long long dhp_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float d = rnn_total(dh, dh_rs, dh_out, dho_rs, b, j);
        const float* s = saved + b * sv_rs;
        float r = s[j], z = s[hidden + j], n = s[2 * hidden + j], hn = s[3 * hidden + j];
        float dn = d * (1.0f - z) * (1.0f - n * n);
        float dz = d * (h_prev[b * hp_rs + j] - n) * z * (1.0f - z);
        float dr = dn * hn * r * (1.0f - r);
        float* x = dgi + b * dgi_rs;
        float* hh = dgh + b * dgh_rs;
        x[j] = dr;
        x[hidden + j] = dz;
        x[2 * hidden + j] = dn;
        hh[j] = dr;
        hh[hidden + j] = dz;
        hh[2 * hidden + j] = dn * r;
        dh_prev[b * dhp_rs + j] = d * z;
    }
}

// The plain RNN's backward from its output h: tanh' = 1 − h², relu' = h > 0.
extern "C" __global__ void rnn_cell_backward_f32(long long rows, long long hidden, int relu,
                                                 const float* __restrict__ dh, long long dh_rs,
                                                 const float* __restrict__ dh_out, long long dho_rs,
                                                 const float* __restrict__ h, long long h_rs, float* __restrict__ dgi,
                                                 long long dgi_rs) {
    long long total = rows * hidden;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        long long b = t / hidden, j = t % hidden;
        float d = rnn_total(dh, dh_rs, dh_out, dho_rs, b, j);
        float y = h[b * h_rs + j];
        dgi[b * dgi_rs + j] = relu ? (y > 0.0f ? d : 0.0f) : d * (1.0f - y * y);
    }
}
