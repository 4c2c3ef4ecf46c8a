// Row reductions (f32) over the last dimension of a [rows, cols] buffer: one block per row,
// FERRITE_BLOCK threads, each summing a strided slice of the row, then a fixed tree in shared
// memory. The order of additions depends only on cols and the block size, never on timing: the
// result is the same on every run (the CPU backend's reductions are deterministic too).

// block_sum, block_max and FERRITE_BLOCK come from block_reduce.cuh.

// The max of a row and the sum of exp(x - max) over it: the first two passes of softmax,
// log_softmax and cross entropy (PyTorch's order). Returns the max; the sum goes to *sum.
__device__ __forceinline__ float row_max_sumexp(const float* x, long long cols, float* shared, float* sum) {
    float m = FERRITE_NEG_INF;
    for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) m = fmaxf(m, x[c]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) s += expf(x[c] - m);
    *sum = block_sum(s, shared);
    return m;
}

extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
sum_rows_f32(long long rows, long long cols, const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * cols;
        float acc = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) acc += row[c];
        float total = block_sum(acc, shared);
        if (threadIdx.x == 0) out[r] = total;
    }
}

extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
max_rows_f32(long long rows, long long cols, const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* row = in + r * cols;
        float acc = FERRITE_NEG_INF;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) acc = fmaxf(acc, row[c]);
        float m = block_max(acc, shared);
        if (threadIdx.x == 0) out[r] = m;
    }
}

// Softmax over each row: max, then sum of exp(x - max), then the quotient (PyTorch's order).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
softmax_rows_f32(long long rows, long long cols, const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = in + r * cols;
        float* y = out + r * cols;
        float s;
        float m = row_max_sumexp(x, cols, shared, &s);
        float inv = 1.0f / s;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) y[c] = expf(x[c] - m) * inv;
    }
}

// Backward of softmax: dx = y * (dy - sum(dy * y)).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
softmax_rows_backward_f32(long long rows, long long cols, const float* __restrict__ y,
                          const float* __restrict__ dy, float* __restrict__ dx) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* yr = y + r * cols;
        const float* gr = dy + r * cols;
        float dot = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) dot += yr[c] * gr[c];
        dot = block_sum(dot, shared);
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) dx[r * cols + c] = yr[c] * (gr[c] - dot);
    }
}

// Cross entropy of logits [rows, cols] against class indices (PyTorch's ignore_index skips a
// row: loss 0, excluded from the count): loss[r] = logsumexp(x) - x[target]. A target outside
// [0, cols) that is not ignore_index is a device-side error: the first such row + 1 is written to
// *bad_row, which the host reads at the next synchronisation and reports with the op.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
cross_entropy_rows_f32(long long rows, long long cols, const float* __restrict__ logits,
                       const long long* __restrict__ target, long long ignore_index,
                       float* __restrict__ loss, unsigned long long* __restrict__ bad_row) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = logits + r * cols;
        long long t = target[r];
        float s;
        float m = row_max_sumexp(x, cols, shared, &s);
        if (threadIdx.x == 0) {
            bool ignored = t == ignore_index;
            bool valid = t >= 0 && t < cols;
            if (!ignored && !valid) atomicCAS(bad_row, 0ull, (unsigned long long)(r + 1));
            loss[r] = (ignored || !valid) ? 0.0f : logf(s) + m - x[t];
        }
    }
}

// Gradient of cross entropy (class indices, no label smoothing) for each row:
// dlogits = (softmax(x) - onehot(target)) * scale[r], where the host sets scale[r] to the
// upstream gradient over the number of non-ignored rows (reduction mean), or the upstream
// gradient itself (sum), and 0 for an ignored row. Rows with an out-of-range class were flagged by
// the forward pass and get a zero gradient.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
cross_entropy_rows_backward_f32(long long rows, long long cols, const float* __restrict__ logits,
                                const long long* __restrict__ target, const float* __restrict__ scale,
                                float* __restrict__ dlogits) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = logits + r * cols;
        float* d = dlogits + r * cols;
        long long t = target[r];
        bool valid = t >= 0 && t < cols;
        float k = valid ? scale[r] : 0.0f;
        float s;
        float m = row_max_sumexp(x, cols, shared, &s);
        float inv = 1.0f / s;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            d[c] = (expf(x[c] - m) * inv - (c == t ? 1.0f : 0.0f)) * k;
        }
    }
}

// Sums over the middle dimension of an [outer, rows, cols] buffer into [outer, cols]: the
// gradient of a broadcast (a bias, an expanded dimension). One thread per output element walks its
// rows in order, so the result does not depend on the launch (deterministic, no atomics).
extern "C" __global__ void sum_middle_f32(long long outer, long long rows, long long cols,
                                          const float* __restrict__ in, float* __restrict__ out) {
    long long total = outer * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long o = i / cols;
        long long c = i % cols;
        const float* base = in + o * rows * cols + c;
        float acc = 0.0f;
        for (long long r = 0; r < rows; ++r) acc += base[r * cols];
        out[i] = acc;
    }
}

// log_softmax over each row: x - max - log(sum(exp(x - max))).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
log_softmax_rows_f32(long long rows, long long cols, const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = in + r * cols;
        float* y = out + r * cols;
        float s;
        float m = row_max_sumexp(x, cols, shared, &s);
        float lse = logf(s) + m;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) y[c] = x[c] - lse;
    }
}

// Backward of log_softmax from its output y: dx = dy - exp(y) * sum(dy).
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
log_softmax_rows_backward_f32(long long rows, long long cols, const float* __restrict__ y,
                              const float* __restrict__ dy, float* __restrict__ dx) {
    __shared__ float shared[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* yr = y + r * cols;
        const float* gr = dy + r * cols;
        float s = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) s += gr[c];
        s = block_sum(s, shared);
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) dx[r * cols + c] = gr[c] - expf(yr[c]) * s;
    }
}

// Max of each row with the index of its first occurrence (PyTorch's max(dim) on the CPU; a NaN is
// the max, as in PyTorch). The block reduces (value, index) pairs with a fixed tree; ties keep the
// smaller index, so the result does not depend on the launch.
extern "C" __global__ void __launch_bounds__(FERRITE_BLOCK)
max_rows_with_index_f32(long long rows, long long cols, const float* __restrict__ in, float* __restrict__ out,
                        long long* __restrict__ index) {
    __shared__ float vals[FERRITE_BLOCK];
    __shared__ long long idxs[FERRITE_BLOCK];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = in + r * cols;
        float best = FERRITE_NEG_INF;
        long long at = cols;  // "none yet": larger than any index
        for (long long c = threadIdx.x; c < cols; c += FERRITE_BLOCK) {
            float v = x[c];
            bool better = (v != v) ? !(best != best) : (v > best || at == cols);
            if (better) {
                best = v;
                at = c;
            }
        }
        vals[threadIdx.x] = best;
        idxs[threadIdx.x] = at;
        __syncthreads();
        for (int s = FERRITE_BLOCK / 2; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                float a = vals[threadIdx.x], b = vals[threadIdx.x + s];
                long long ia = idxs[threadIdx.x], ib = idxs[threadIdx.x + s];
                bool a_nan = a != a, b_nan = b != b;
                bool take_b;
                if (ib == cols) take_b = false;
                else if (ia == cols) take_b = true;
                else if (a_nan || b_nan) take_b = b_nan && (!a_nan || ib < ia);
                else take_b = b > a || (b == a && ib < ia);
                if (take_b) {
                    vals[threadIdx.x] = b;
                    idxs[threadIdx.x] = ib;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            out[r] = vals[0];
            index[r] = idxs[0];
        }
        __syncthreads();
    }
}
