// Index ops (f32 values, i64 indices) over tensors viewed as [outer, dim, inner], the indexed
// dimension in the middle: gather, scatter_add, index_select, index_add, one_hot; and the range
// check of class targets (check_indices_i64). An index outside [0, dim) is a device-side error:
// bad[0] keeps the complement of the smallest bad flat position of the index (atomicMax of ~p, 0
// when none), so the first bad index in order is reported whatever order the threads ran in;
// flag_index_value_i64, queued right after, copies that index's value to bad[1] for the host to
// report at the next synchronisation. Nothing is read or written out of bounds. Additions
// into one destination happen in source order: one thread per destination element scans the
// sources (deterministic, no atomics).

// Flags position p of the index as out of range (see above).
__device__ __forceinline__ void flag_bad_index(unsigned long long* bad, long long p) {
    atomicMax(bad, ~(unsigned long long)p);
}

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
            flag_bad_index(bad, p);
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
            if (k == 0 && (t < 0 || t >= dim)) flag_bad_index(bad, at);
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
            flag_bad_index(bad, j);
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
            if (p == 0 && (t < 0 || t >= dim)) flag_bad_index(bad, j);
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
        if (c == 0 && (k < 0 || k >= classes)) flag_bad_index(bad, p);
        out[q] = k == c ? 1 : 0;
    }
}

// Class targets: index[p] must be in [0, size) unless it equals ignore (when has_ignore); negative
// values are not wrapped. Only flags (see above).
extern "C" __global__ void check_indices_i64(long long count, long long size, long long ignore, int has_ignore,
                                             const long long* __restrict__ index, unsigned long long* __restrict__ bad) {
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < count;
         p += (long long)gridDim.x * blockDim.x) {
        long long k = index[p];
        if (!(has_ignore && k == ignore) && (k < 0 || k >= size)) flag_bad_index(bad, p);
    }
}

// One thread, queued after a kernel that may have flagged `bad`: bad[1] = the flagged index's value.
extern "C" __global__ void flag_index_value_i64(const long long* __restrict__ index, unsigned long long* __restrict__ bad) {
    if (blockIdx.x == 0 && threadIdx.x == 0 && bad[0] != 0ull) {
        bad[1] = (unsigned long long)index[~bad[0]];
    }
}
