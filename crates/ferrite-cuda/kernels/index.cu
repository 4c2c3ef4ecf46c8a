// Index ops (f32 values, i64 indices) over tensors viewed as [outer, dim, inner], the indexed
// dimension in the middle: gather, scatter_add, index_select, index_add, one_hot. An index outside
// [0, dim) is a device-side error: the first bad flat position + 1 goes to *bad for the host to
// report at the next synchronisation, and nothing is read or written out of bounds. Additions
// into one destination happen in source order: one thread per destination element scans the
// sources (deterministic, no atomics).

// out[o, j, i] = x[o, index[o, j, i], i]; index and out are [outer, count, inner].
extern "C" __global__ void gather_f32(long long outer, long long dim, long long count, long long inner,
                                      const float* __restrict__ x, const long long* __restrict__ index,
                                      float* __restrict__ out, unsigned long long* __restrict__ bad) {
    long long total = outer * count * inner;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long i = p % inner;
        long long o = p / (count * inner);
        long long k = index[p];
        if (k < 0 || k >= dim) {
            atomicCAS(bad, 0ull, (unsigned long long)(p + 1));
            out[p] = 0.0f;
        } else {
            out[p] = x[(o * dim + k) * inner + i];
        }
    }
}

// dst[o, k, i] += sum over j (in order) of src[o, j, i] where index[o, j, i] == k; index and src
// are [outer, count, inner], dst [outer, dim, inner].
extern "C" __global__ void scatter_add_f32(long long outer, long long dim, long long count, long long inner,
                                           float* __restrict__ dst, const long long* __restrict__ index,
                                           const float* __restrict__ src, unsigned long long* __restrict__ bad) {
    long long total = outer * dim * inner;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long i = p % inner;
        long long k = (p / inner) % dim;
        long long o = p / (dim * inner);
        float acc = dst[p];
        for (long long j = 0; j < count; ++j) {
            long long at = (o * count + j) * inner + i;
            long long t = index[at];
            if (t == k) acc += src[at];
            if (k == 0 && (t < 0 || t >= dim)) atomicCAS(bad, 0ull, (unsigned long long)(at + 1));
        }
        dst[p] = acc;
    }
}

// out[o, j, i] = x[o, index[j], i]; index has count entries.
extern "C" __global__ void index_select_f32(long long outer, long long dim, long long count, long long inner,
                                            const float* __restrict__ x, const long long* __restrict__ index,
                                            float* __restrict__ out, unsigned long long* __restrict__ bad) {
    long long total = outer * count * inner;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long i = p % inner;
        long long j = (p / inner) % count;
        long long o = p / (count * inner);
        long long k = index[j];
        if (k < 0 || k >= dim) {
            atomicCAS(bad, 0ull, (unsigned long long)(j + 1));
            out[p] = 0.0f;
        } else {
            out[p] = x[(o * dim + k) * inner + i];
        }
    }
}

// dst[o, index[j], i] += src[o, j, i], for j in order (the gradient of index_select).
extern "C" __global__ void index_add_f32(long long outer, long long dim, long long count, long long inner,
                                         float* __restrict__ dst, const long long* __restrict__ index,
                                         const float* __restrict__ src, unsigned long long* __restrict__ bad) {
    long long total = outer * dim * inner;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        long long i = p % inner;
        long long k = (p / inner) % dim;
        long long o = p / (dim * inner);
        float acc = dst[p];
        for (long long j = 0; j < count; ++j) {
            long long t = index[j];
            if (t == k) acc += src[(o * count + j) * inner + i];
            if (p == 0 && (t < 0 || t >= dim)) atomicCAS(bad, 0ull, (unsigned long long)(j + 1));
        }
        dst[p] = acc;
    }
}

// out[p, c] = (index[p] == c) as i64, for c in [0, classes).
extern "C" __global__ void one_hot_i64(long long count, long long classes, const long long* __restrict__ index,
                                       long long* __restrict__ out, unsigned long long* __restrict__ bad) {
    long long total = count * classes;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < total;
         q += (long long)gridDim.x * blockDim.x) {
        long long p = q / classes, c = q % classes;
        long long k = index[p];
        if (c == 0 && (k < 0 || k >= classes)) atomicCAS(bad, 0ull, (unsigned long long)(p + 1));
        out[q] = k == c ? 1 : 0;
    }
}
