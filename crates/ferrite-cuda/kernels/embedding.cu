// Embedding lookup and its gradient (f32). An index outside [0, rows) is a device-side error:
// the first bad position + 1 goes to *bad_index for the host to report at the next
// synchronisation, and the output row is zero.

extern "C" __global__ void embedding_f32(long long count, long long rows, long long dim,
                                         const long long* __restrict__ indices, const float* __restrict__ table,
                                         float* __restrict__ out, unsigned long long* __restrict__ bad_index) {
    long long total = count * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long pos = i / dim;
        long long col = i % dim;
        long long row = indices[pos];
        if (row < 0 || row >= rows) {
            if (col == 0) atomicCAS(bad_index, 0ull, (unsigned long long)(pos + 1));
            out[i] = 0.0f;
        } else {
            out[i] = table[row * dim + col];
        }
    }
}

// Gradient of the table: one thread per column walks the positions in order and adds each
// position's gradient to its row, so repeated indices accumulate in a fixed order (deterministic,
// no atomics). Out-of-range indices were reported by the forward pass and are skipped.
extern "C" __global__ void embedding_backward_f32(long long count, long long rows, long long dim,
                                                  const long long* __restrict__ indices,
                                                  const float* __restrict__ grad_out,
                                                  float* __restrict__ grad_table) {
    for (long long col = blockIdx.x * (long long)blockDim.x + threadIdx.x; col < dim;
         col += (long long)gridDim.x * blockDim.x) {
        for (long long pos = 0; pos < count; ++pos) {
            long long row = indices[pos];
            if (row >= 0 && row < rows) grad_table[row * dim + col] += grad_out[pos * dim + col];
        }
    }
}
